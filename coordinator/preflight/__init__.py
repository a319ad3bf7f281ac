"""Pre-flight: everything checked before a run starts anything (coordinator/preflight/inputs.py
lists the stages), shared by `tandem run` and `tandem run --dry-run`."""

from coordinator.preflight.inputs import Preflight, check_inputs

__all__ = ["Preflight", "check_inputs"]
