# kvdir directory node. Built by deploy/images/build.sh from a static binary
# staged on the host (nothing is pulled: FROM scratch).
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kvdir-directory" \
      org.opencontainers.image.description="kvdir directory node: Raft-replicated index of which worker holds which KV-cache prefix" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED" \
      org.opencontainers.image.source="https://github.com/kvdir/kvdir" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY passwd group /etc/
COPY --chown=65532:65532 data /data
COPY directory healthcheck /usr/local/bin/
# Listen on every interface; --raft-advertise (KVDIR_DIRECTORY_RAFT_ADVERTISE)
# and --api-advertise must name this container as the others reach it.
ENV KVDIR_DIRECTORY_RAFT_ADDR=0.0.0.0:7000 \
    KVDIR_DIRECTORY_API_ADDR=0.0.0.0:7001 \
    KVDIR_DIRECTORY_HTTP_ADDR=0.0.0.0:7002 \
    KVDIR_DIRECTORY_DATA_DIR=/data \
    HEALTHCHECK_URL=http://127.0.0.1:7002/readyz
EXPOSE 7000 7001 7002
VOLUME ["/data"]
USER 65532:65532
WORKDIR /data
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 CMD ["/usr/local/bin/healthcheck"]
# SIGTERM: a leader hands leadership over before it stops.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/directory"]
