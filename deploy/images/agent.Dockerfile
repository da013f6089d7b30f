# kvdir agent: follows one engine's KV-cache events and publishes them to the
# directory. Built by deploy/images/build.sh (FROM scratch, nothing pulled).
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kvdir-agent" \
      org.opencontainers.image.description="kvdir engine-side agent: engine KV-cache events to directory batches" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED" \
      org.opencontainers.image.source="https://github.com/kvdir/kvdir" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY passwd group /etc/
COPY agent healthcheck /usr/local/bin/
# The KV-event sockets' directory: a volume mounted here is created owned by
# the image's user, so that the engine can bind its ipc:// endpoints in it.
COPY --chown=65532:65532 data /run/kvdir
ENV KVDIR_AGENT_HTTP_ADDR=0.0.0.0:9400 \
    HEALTHCHECK_URL=http://127.0.0.1:9400/healthz
EXPOSE 9400
USER 65532:65532
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 CMD ["/usr/local/bin/healthcheck"]
# SIGTERM: flush, deregister the worker, exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/agent"]
