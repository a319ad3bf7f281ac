"""Weight loading inside vLLM's worker process (the class passed as `worker_extension_cls`).

vLLM mixes this class into its worker, so its methods run where the model lives and are
reached with `collective_rpc(name, args=...)` (STAGE, APPLY below). In vLLM's default
multi-process mode collective_rpc pickles its arguments between processes and cannot carry
tensors, so the weight source arrives as JSON (tandem.weight_source) and the bytes come from
the source itself: the weight-sync collective, shared-memory files or CUDA IPC handles.

Two steps, so that a failed read never touches the model:
1. STAGE reads a whole version into memory (generator_svc/staging.py), or raises, staging nothing;
2. APPLY loads it with `model_runner.reload_weights`, which restores the layer layout, loads
   HF-named checkpoint tensors and re-packs the CPU kernels' weights (plain
   `model.load_weights` fails on CPU once the linear weights are packed); then a tied output
   head, which that reload skips, is re-packed from the new embedding (tied_weights.py).
"""

from __future__ import annotations

import torch

from generator_svc.staging import Stager
from generator_svc.tied_weights import refresh_tied_layers, unquantized_embedding_methods
from tandem.weight_source import source_from_json

STAGE = "tandem_stage"
APPLY = "tandem_apply_staged"


class TandemWeightExtension:
    """Mixed into vLLM's worker; attribute names carry a `tandem_` prefix to avoid clashes."""

    def tandem_stage(self, source_json: str, version: int) -> int:
        """Read `version` from the source in full and keep it staged; returns the number of tensors."""
        self._tandem_staged = None  # a previous, never-applied version is dropped
        stager = getattr(self, "_tandem_stager", None)
        if stager is None:
            stager = self._tandem_stager = Stager(torch.device(self.device))
        staged = stager.read(source_from_json(source_json), version)
        self._tandem_staged = (version, staged)
        return len(staged)

    def tandem_apply_staged(self, version: int) -> int:
        """Load the staged `version` into the model; returns the number of tensors loaded."""
        staged = getattr(self, "_tandem_staged", None)
        self._tandem_staged = None
        if staged is None or staged[0] != version:
            raise RuntimeError(f"weight version {version} is not staged (staged: {staged and staged[0]})")
        tensors = staged[1]
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        # a tied head is not reloaded: its packed CPU copy would keep the first weights (tied_weights.py)
        refresh_tied_layers(self.model_runner.get_model(), unquantized_embedding_methods(),
                            reloaded={name.rpartition(".")[0] for name in tensors})
        return len(tensors)
