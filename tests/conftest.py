"""Shared by every test: one vLLM cache for the whole suite. Most tests give each run a fresh
TANDEM_HOME (the build-once caches are part of what they check), which would also give every
generator a cold vLLM cache, and vLLM then inspects the model's architecture in a subprocess that
imports vLLM again (~6 s of CPU per generator start). The model-info cache is keyed by the hash
of vLLM's model file, so sharing it changes nothing else."""

import os
from pathlib import Path

os.environ.setdefault("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "tandem-tests" / "vllm-cache"))
