#!/usr/bin/env bash
# Builds kvdir's container images without pulling anything: each binary is
# compiled on the host as a static Go program (CGO_ENABLED=0, -trimpath,
# version in -ldflags) into a staging directory, and a FROM scratch
# Dockerfile copies it in with the healthcheck probe and an /etc/passwd line
# for the non-root user 65532.
#
# Usage: deploy/images/build.sh [binary ...]   (default: every binary)
# Environment:
#   KVDIR_IMAGE_PREFIX  image name prefix (default kvdir/): kvdir/directory
#   KVDIR_IMAGE_TAG     image tag (default dev)
#   VERSION             version written into the binaries and labels
#                       (default: git describe --tags --always --dirty)
#   GO, DOCKER          the go and docker commands
#
# A binary whose cmd/<name> directory does not exist yet is skipped with a
# message. One that fails to build does not stop the others; the script then
# exits 1 after listing it.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

GO="${GO:-go}"
DOCKER="${DOCKER:-docker}"
prefix="${KVDIR_IMAGE_PREFIX:-kvdir/}"
tag="${KVDIR_IMAGE_TAG:-dev}"
version="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
cli=github.com/kvdir/kvdir/internal/cli # --version prints its version and commit
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
all=(directory router agent enginesim kvdirctl)
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=("${all[@]}")

stage="$root/deploy/.build"
mkdir -p "$stage"

build_go() { # build_go <package> <output>
  CGO_ENABLED=0 GOOS=linux "$GO" build -trimpath \
    -ldflags "-s -w -X $cli.version=$version -X $cli.commit=${revision:0:12}" -o "$2" "$1"
}

echo "== healthcheck probe"
build_go ./deploy/healthcheck "$stage/healthcheck"

built=() skipped=() failed=()
for b in "${bins[@]}"; do
  dockerfile="deploy/images/$b.Dockerfile"
  if [ ! -f "$dockerfile" ]; then
    echo "build.sh: unknown binary $b (known: ${all[*]})" >&2
    exit 2
  fi
  if [ ! -d "cmd/$b" ]; then
    echo "== $b: skipped, cmd/$b does not exist yet"
    skipped+=("$b")
    continue
  fi
  echo "== $b"
  ctx="$stage/$b"
  rm -rf "$ctx"
  mkdir -p "$ctx/data"
  if ! build_go "./cmd/$b" "$ctx/$b"; then
    echo "   $b: go build failed" >&2
    failed+=("$b")
    continue
  fi
  if command -v file >/dev/null && ! file "$ctx/$b" | grep -q 'statically linked'; then
    echo "   $b: not statically linked: $(file "$ctx/$b")" >&2
    failed+=("$b")
    continue
  fi
  cp "$stage/healthcheck" "$ctx/healthcheck"
  cp deploy/images/passwd deploy/images/group "$ctx/"
  old="$("$DOCKER" image inspect -f '{{.Id}}' "$prefix$b:$tag" 2>/dev/null || true)"
  # The legacy builder's deprecation notice goes to stderr: show it only
  # when the build fails.
  if ! "$DOCKER" build --quiet -f "$dockerfile" \
      --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
      -t "$prefix$b:$tag" "$ctx" >"$ctx.log" 2>&1; then
    cat "$ctx.log" >&2
    echo "   $b: docker build failed" >&2
    failed+=("$b")
    continue
  fi
  # The image this one replaces is left untagged: remove it unless a
  # container still uses it.
  if [ -n "$old" ] && [ "$old" != "$("$DOCKER" image inspect -f '{{.Id}}' "$prefix$b:$tag")" ]; then
    "$DOCKER" rmi "$old" >/dev/null 2>&1 || true
  fi
  echo "   $prefix$b:$tag ($("$DOCKER" image inspect -f '{{.Size}}' "$prefix$b:$tag") bytes, version $version)"
  built+=("$b")
done
echo "built: ${built[*]:-none}${skipped[*]:+; skipped (no cmd/ dir yet): ${skipped[*]}}${failed[*]:+; FAILED: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
