"""Step time of the Megatron backend per layout, and the HF -> Megatron conversion time, on
the embedded tiny model (CPU, gloo, fp32): one torchrun per layout running
`tests.megatron.worker bench`, a GRPO step of 16 samples (micro-batches of 4), median of 5.

    python benchmarks/megatron_step_time.py
The first layout converts (fresh cache directory); the others load the cached conversion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {"dtensor (reference)": (1, None), "tp1": (1, {}), "tp2": (2, {"tensor_model_parallel_size": 2}),
           "pp2": (2, {"pipeline_model_parallel_size": 2}),
           "tp2xpp2+distopt": (4, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                                   "optimizer": {"use_distributed_optimizer": True}})}


def main() -> None:
    from coordinator.embedded.tiny_model import ensure_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model_dir = str(ensure_tiny_model(root / "model"))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TANDEM_MEGATRON_CHECKPOINT_DIR": str(root / "cache")}
        for name, (nproc, cfg) in LAYOUTS.items():
            settings = {"model_name": model_dir}
            if cfg is not None:
                settings["megatron_cfg"] = {"enabled": True, **cfg}
            (root / "s.json").write_text(json.dumps(settings))
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                            "-m", "tests.megatron.worker", str(root / "s.json"), "bench5", str(root / "o.json")],
                           env=env, check=True, capture_output=True)
            out = json.loads((root / "o.json").read_text())
            conversion = f"{out['conversion']} in {out['conversion_s']:.2f} s" if out.get("conversion") else ""
            print(f"{name:22s} ranks={nproc}  step {out['step_s'] * 1000:7.1f} ms  {conversion}", flush=True)


if __name__ == "__main__":
    main()
