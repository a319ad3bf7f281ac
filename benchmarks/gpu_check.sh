#!/usr/bin/env bash
# One command for a bare one-GPU machine (NVIDIA driver, the repository checked out, only the package
# index reachable): install the GPU stack (scripts/setup.sh), then, within --budget-s (default 540 s,
# 9 minutes, the install not counted), run and measure:
#   1. random-init Qwen2.5-0.5B- and 1.5B-shaped bf16 checkpoints, built locally (benchmarks/real_size_model.py)
#   2. a weight-sync smoke test (benchmarks/weight_sync.py, 64 MB to one receiver)
#   3. colocated CUDA IPC refit of both shapes: sleep s, wake s, refit s and GB/s, memory freed (benchmarks/gpu_refit.py)
#   4. 3 GRPO steps of the 0.5B shape, colocated and dedicated on the one GPU (`tandem run`): step phases
#      from metrics.jsonl, refits from the coordinator log
#   5. a 1-rank Megatron step of the 0.5B shape (tests.megatron.worker bench2)
#   6. the `gpu` tests (pytest -m gpu)
# with the peak GPU memory of each step (nvidia-smi sampled every 0.5 s), all into one results file,
# benchmarks/results/DATE-gpu-check.json (written after every step).
#
#   bash benchmarks/gpu_check.sh [--dry-run] [--budget-s S] [--out FILE]
#
# --dry-run: no install, no GPU: prints the plan and checks the scripts, the checkpoint builder at a
# tiny size, that the GRPO and Megatron configs load and that pytest collects the gpu tests.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
  esac
done
if [ "$dry" = 1 ]; then
  bash -n scripts/setup.sh
  PY=.venv/bin/python
  [ -x "$PY" ] || PY=python3
  exec "$PY" benchmarks/gpu_check.py "$@"
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L | grep -q '^GPU '; then
  echo "gpu_check: nvidia-smi sees no GPU here (use --dry-run on a machine without one)" >&2
  exit 2
fi
started=$(date +%s)
TANDEM_STACK=gpu bash scripts/setup.sh
install_s=$(( $(date +%s) - started ))
echo "gpu_check: set-up took ${install_s} s"
exec .venv/bin/python benchmarks/gpu_check.py --install-s "$install_s" "$@"
