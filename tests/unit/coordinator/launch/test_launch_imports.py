"""`tandem run` launches its services before the coordinator imports torch or transformers
(~1 s of imports on this machine), so the services start that much sooner: the real CLI, run in
a subprocess until the launcher's first start, which records what was imported by then."""

import os
import subprocess
import sys

from coordinator.embedded.arithmetic import ensure_arithmetic_dataset
from coordinator.embedded.tiny_model import ensure_tiny_model

PROBE = """
import sys
from coordinator.launch.launcher import LocalLauncher
from coordinator.cli.main import main

def start(self, spec):
    print("heavy at launch:", sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules))
    raise SystemExit(0)

LocalLauncher.start = start
sys.argv = ["tandem", "run", "logger.log_dir=" + sys.argv[1], "logger.tensorboard_enabled=false"]
main()
"""


def test_the_services_launch_before_torch_is_imported(tmp_path):
    ensure_tiny_model(tmp_path / "home")  # built here: building it is what imports torch
    ensure_arithmetic_dataset(tmp_path / "home", 0, 500, 16)
    env = {**os.environ, "TANDEM_HOME": str(tmp_path / "home")}
    env.pop("TANDEM_TOKEN", None)
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "runs")], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert "heavy at launch: []" in done.stdout, done.stdout + done.stderr
