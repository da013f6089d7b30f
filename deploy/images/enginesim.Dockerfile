# kvdir enginesim: a simulated vLLM engine (OpenAI API, KV events over ZMQ).
# Built by deploy/images/build.sh (FROM scratch, nothing pulled).
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kvdir-enginesim" \
      org.opencontainers.image.description="kvdir engine simulator: vLLM-compatible OpenAI API and KV-cache events without a GPU" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED" \
      org.opencontainers.image.source="https://github.com/kvdir/kvdir" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY passwd group /etc/
COPY enginesim healthcheck /usr/local/bin/
# The KV-event sockets' directory: a volume mounted here is created owned by
# the image's user, so that the engine can bind its ipc:// endpoints in it.
COPY --chown=65532:65532 data /run/kvdir
# HTTP on every interface; KV events PUB and replay ROUTER on unix sockets in
# /run/kvdir (mount a volume there that only the engine's agent shares).
ENV KVDIR_ENGINESIM_ADDR=0.0.0.0:8000 \
    KVDIR_ENGINESIM_KV_EVENTS_ENDPOINT=ipc:///run/kvdir/kv-events.sock \
    KVDIR_ENGINESIM_KV_EVENTS_REPLAY_ENDPOINT=ipc:///run/kvdir/kv-replay.sock \
    HEALTHCHECK_URL=http://127.0.0.1:8000/health
EXPOSE 8000
USER 65532:65532
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 CMD ["/usr/local/bin/healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/enginesim"]
