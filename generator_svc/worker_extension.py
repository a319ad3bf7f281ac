"""Weight receive inside vLLM's worker process (the class passed as `worker_extension_cls`).

vLLM mixes this class into its worker, so its methods run where the model lives and are
reached with `collective_rpc(name, args=...)`. In vLLM's default multi-process mode
collective_rpc pickles its arguments between processes and cannot carry tensors, so the
group and bucket plan arrive as JSON strings and the bytes come over the weight-sync
collective itself.

Two steps, so that a failed transfer never touches the model:
1. `tandem_stage_weights` receives a whole version into memory (or raises, staging nothing);
   colocated generators stage from shared-memory files (`tandem_stage_shared`, CPU) or from the
   trainer's GPU buffers through CUDA IPC handles (`tandem_stage_cuda_ipc`);
2. `tandem_apply_staged` loads it with `model_runner.reload_weights`, which restores the
   layer layout, loads HF-named checkpoint tensors and re-packs the CPU kernels' weights
   (plain `model.load_weights` fails on CPU once the linear weights are packed); then a tied
   output head, which that reload skips, is re-packed from the new embedding (tied_weights.py).
"""

from __future__ import annotations

import dataclasses
import json

import torch

from generator_svc.tied_weights import refresh_tied_layers, unquantized_embedding_methods
from tandem.weight_sync import BucketPlan, GroupSpec, TensorSpec, WeightReceiver


def plan_to_json(plan: BucketPlan) -> str:
    return json.dumps(dataclasses.asdict(plan))


def plan_from_json(text: str) -> BucketPlan:
    raw = json.loads(text)
    tensors = tuple(TensorSpec(**{**t, "shape": tuple(t["shape"])}) for t in raw["tensors"])
    return BucketPlan(tensors, tuple(raw["bucket_sizes_bytes"]))


def group_to_json(group: GroupSpec) -> str:
    return json.dumps(dataclasses.asdict(group))


def group_from_json(text: str) -> GroupSpec:
    return GroupSpec(**json.loads(text))


class TandemWeightExtension:
    """Mixed into vLLM's worker; attribute names carry a `tandem_` prefix to avoid clashes."""

    def tandem_stage_weights(self, group_json: str, rank: int, version: int, plan_json: str) -> int:
        """Receive `version` in full and keep it staged; returns the number of tensors. Raises on failure."""
        self._tandem_staged = None  # a previous, never-applied version is dropped
        receiver = getattr(self, "_tandem_receiver", None)
        if receiver is None:
            receiver = self._tandem_receiver = WeightReceiver(device=torch.device(self.device))
        staged = receiver.receive(group_from_json(group_json), rank, version, plan_from_json(plan_json))
        self._tandem_staged = (version, staged)
        return len(staged)

    def tandem_stage_shared(self, directory: str, version: int) -> int:
        """Colocated mode: stage `version` from the safetensors files the trainer wrote into
        `directory` (shared memory: the files are mapped, not sent). Raises, staging nothing, on failure."""
        from pathlib import Path

        from safetensors.torch import load_file

        self._tandem_staged = None
        files = sorted(Path(directory).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors files in {directory}")
        staged = {name: tensor for f in files for name, tensor in load_file(str(f), device=str(self.device)).items()}
        self._tandem_staged = (version, staged)
        return len(staged)

    def tandem_stage_cuda_ipc(self, payloads: list[bytes], plan_json: str, version: int) -> int:
        """Colocated on a GPU: stage `version` from the trainer's buckets through their CUDA IPC
        handles (tandem.cuda_ipc). The staged tensors are views of the trainer's memory, copied
        into the model by `tandem_apply_staged` within the same ReceiveWeights call, before the
        trainer may free them. Raises, staging nothing, on failure."""
        from tandem.cuda_ipc import import_handle, unpack_bucket

        self._tandem_staged = None
        if torch.device(self.device).type != "cuda":
            raise RuntimeError(f"CUDA IPC weights need a generator on a GPU; this one runs on {self.device}")
        plan = plan_from_json(plan_json)
        staged: dict[str, torch.Tensor] = {}
        for index, payload in enumerate(payloads):
            staged.update(unpack_bucket(plan, index, import_handle(payload, plan.bucket_sizes_bytes[index])))
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

    def tandem_close_receiver(self) -> None:
        """Leave the weight-sync group (on shutdown)."""
        receiver = getattr(self, "_tandem_receiver", None)
        if receiver is not None:
            receiver.close()
            self._tandem_receiver = None
