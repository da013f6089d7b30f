# kvdir router: OpenAI-compatible proxy placing each request where its
# KV-cache prefix lives. Built by deploy/images/build.sh (FROM scratch).
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kvdir-router" \
      org.opencontainers.image.description="kvdir router: OpenAI-compatible proxy with KV-cache-aware placement" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED" \
      org.opencontainers.image.source="https://github.com/kvdir/kvdir" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY passwd group /etc/
COPY router healthcheck /usr/local/bin/
ENV KVDIR_ROUTER_ADDR=0.0.0.0:8080 \
    HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
EXPOSE 8080
USER 65532:65532
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 CMD ["/usr/local/bin/healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/router"]
