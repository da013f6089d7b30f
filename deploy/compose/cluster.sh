#!/usr/bin/env bash
# Starts and stops the local compose cluster (deploy/compose/docker-compose.yml).
#
#   deploy/compose/cluster.sh up      start what has an image, wait until healthy
#   deploy/compose/cluster.sh down    stop and remove containers, network and data volumes
#   deploy/compose/cluster.sh ps      list the containers and their health
#   deploy/compose/cluster.sh ctl ARGS...
#                                     kvdirctl ARGS on the cluster's network, over TLS
#                                     with the admin token (e.g. ctl status)
#
# The cluster runs with the secrets in KVDIR_SECRETS (default deploy/secrets,
# relative to the repository): up generates them first if the CA is missing
# (go run ./deploy/gensecrets; GO overrides the go command).
# The routers are started only when their image exists (cmd/router may not
# be built yet); the script says when it leaves them out. COMPOSE overrides
# the compose command (default docker-compose); KVDIR_IMAGE_PREFIX and
# KVDIR_IMAGE_TAG as in .env. KVDIR_COMPOSE_GROUPS=1 adds groups.yml: a
# second directory group (kvdir-dir4..6) serving a second model, with its
# engine and agent (kvdir-engine5, kvdir-agent5), and routers (and ctl) given
# both groups. down always includes groups.yml, so that it removes that
# group's containers and volumes too.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
COMPOSE="${COMPOSE:-docker-compose}"
DOCKER="${DOCKER:-docker}"
# .env supplies the defaults; the environment wins.
prefix="${KVDIR_IMAGE_PREFIX:-$(sed -n 's/^KVDIR_IMAGE_PREFIX=//p' "$here/.env")}"
tag="${KVDIR_IMAGE_TAG:-$(sed -n 's/^KVDIR_IMAGE_TAG=//p' "$here/.env")}"
root="$(cd "$here/../.." && pwd)"
secrets="${KVDIR_SECRETS:-deploy/secrets}"
case "$secrets" in /*) ;; *) secrets="$root/$secrets" ;; esac
export KVDIR_SECRETS_DIR="$secrets"
# The containers run as the images' user (65532) with the secrets' group
# added: files gensecrets gave to that user (it does when run as root) are
# theirs; files of another user need their group bit (set by secrets_ready).
KVDIR_SECRETS_GID="$(stat -c %g "$secrets/ca.crt" 2>/dev/null || id -g)"
export KVDIR_SECRETS_GID
files=(-f "$here/docker-compose.yml")
groups="${KVDIR_COMPOSE_GROUPS:-}"
case "$groups" in
  ""|0) groups="" ;;
  1) files+=(-f "$here/groups.yml") ;;
  *) echo "cluster.sh: KVDIR_COMPOSE_GROUPS=$groups: want 1 (two directory groups) or empty" >&2; exit 2 ;;
esac
compose() { $COMPOSE --project-directory "$here" "${files[@]}" "$@"; }
# down: the files of every variant, so that nothing a variant started is left.
compose_all() { $COMPOSE --project-directory "$here" -f "$here/docker-compose.yml" -f "$here/groups.yml" "$@"; }

# secrets_ready: generate the secrets if the CA is missing, or the second
# group's if they are missing and it is wanted (existing files are kept).
secrets_ready() {
  if [ ! -f "$secrets/ca.crt" ]; then
    echo "cluster.sh: no secrets in $secrets: generating them (make deploy-secrets)"
    (cd "$root" && "${GO:-go}" run ./deploy/gensecrets --out "$secrets")
  elif [ -n "$groups" ] && { [ ! -f "$secrets/kvdir-dir4.crt" ] || [ ! -f "$secrets/agent-engine5.token" ]; }; then
    echo "cluster.sh: $secrets has no secrets for the second group: adding them (make deploy-secrets keeps what exists)"
    (cd "$root" && "${GO:-go}" run ./deploy/gensecrets --out "$secrets")
  fi
  KVDIR_SECRETS_GID="$(stat -c %g "$secrets/ca.crt")"
  if [ "$(stat -c %u "$secrets/ca.key")" != 65532 ]; then
    echo "cluster.sh: $secrets is not owned by the images' user 65532 (gensecrets gives it to them when run as root): making the files group-readable for the containers; the directory will warn about the token files' mode"
    chmod g+r "$secrets"/*
    chmod g+rx "$secrets"
  fi
}

# ctl ARGS...: kvdirctl in its image on kvdir-net, trusting the cluster's CA,
# with the admin token; given both groups with KVDIR_COMPOSE_GROUPS=1.
ctl() {
  local dir=(--directory kvdir-dir1:7001,kvdir-dir2:7001,kvdir-dir3:7001)
  if [ -n "$groups" ]; then
    dir=(--directory-group main=kvdir-dir1:7001,kvdir-dir2:7001,kvdir-dir3:7001
      --directory-group large=kvdir-dir4:7001,kvdir-dir5:7001,kvdir-dir6:7001)
  fi
  "$DOCKER" run --rm --pull never --network kvdir-net --group-add "$KVDIR_SECRETS_GID" \
    -v "$secrets/ca.crt:/etc/kvdir/tls/ca.crt:ro" -v "$secrets/admin.token:/etc/kvdir/tokens/admin:ro" \
    "${prefix}kvdirctl:$tag" "${dir[@]}" \
    --tls-ca /etc/kvdir/tls/ca.crt --token-file /etc/kvdir/tokens/admin "$@"
}

# wait_healthy <timeout seconds> <container...>: until every container's
# health is "healthy"; fails with their states and last logs otherwise.
wait_healthy() {
  local timeout=$1 deadline states c bad
  shift
  deadline=$(( $(date +%s) + timeout ))
  while :; do
    bad=()
    for c in "$@"; do
      state=$("$DOCKER" inspect -f '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$c" 2>/dev/null || echo missing)
      [ "$state" = running/healthy ] || bad+=("$c=$state")
    done
    [ ${#bad[@]} -eq 0 ] && return 0
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "cluster.sh: not healthy after ${timeout}s: ${bad[*]}" >&2
      for c in "${bad[@]%%=*}"; do echo "--- last log lines of $c" >&2; "$DOCKER" logs --tail 20 "$c" >&2 || true; done
      return 1
    fi
    sleep 1
  done
}

up() {
  local services=() missing=() s img
  secrets_ready
  for s in $(compose config --services); do
    case "$s" in
      kvdir-dir*) img="${prefix}directory:$tag" ;;
      kvdir-engine*) img="${prefix}enginesim:$tag" ;;
      kvdir-agent*) img="${prefix}agent:$tag" ;;
      kvdir-router*) img="${prefix}router:$tag" ;;
      *) echo "cluster.sh: unknown service $s" >&2; exit 1 ;;
    esac
    if "$DOCKER" image inspect "$img" >/dev/null 2>&1; then
      services+=("$s")
    else
      missing+=("$s ($img)")
    fi
  done
  for m in "${missing[@]}"; do echo "cluster.sh: leaving out $m: no such image (run make images; cmd/router may not exist yet)"; done
  case " ${services[*]} " in
    *" kvdir-dir1 "*) ;;
    *) echo "cluster.sh: no directory image ${prefix}directory:$tag: run make images first" >&2; exit 1 ;;
  esac
  compose up -d --no-build "${services[@]}"
  wait_healthy 120 "${services[@]}"
  compose ps
}

case "${1:-}" in
  up) up ;;
  down) compose_all down --volumes --remove-orphans --timeout 40 ;;
  ps) compose ps ;;
  ctl) shift; ctl "$@" ;;
  *) echo "usage: $0 up|down|ps|ctl ARGS..." >&2; exit 2 ;;
esac
