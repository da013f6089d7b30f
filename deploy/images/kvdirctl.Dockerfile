# kvdirctl: kvdir's operator CLI, for `docker run --rm` on the cluster's
# network. Built by deploy/images/build.sh (FROM scratch, nothing pulled).
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kvdir-kvdirctl" \
      org.opencontainers.image.description="kvdirctl: kvdir operator CLI" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED" \
      org.opencontainers.image.source="https://github.com/kvdir/kvdir" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY passwd group /etc/
COPY kvdirctl /usr/local/bin/
USER 65532:65532
# A one-shot command, not a service: nothing to probe.
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/kvdirctl"]
