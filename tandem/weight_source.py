"""Where a generator reads a weight version from: one of three sources, one per weight
transport (tandem.colocation decides which, once per run).

    CollectiveSource    join the weight-sync group as `rank` and receive the plan's buckets
                        (dedicated generators; gloo on CPU, NCCL on GPUs)
    SharedMemorySource  map the HF safetensors files the trainer wrote into a directory on the
                        host's shared memory (colocated on CPU)
    CudaIpcSource       open one CUDA IPC handle per bucket of the plan on the trainer's device
                        (colocated on GPUs)

The coordinator builds one per publish and the generator contract carries it
(`GenerationEngine.load_weights(source, version)`); the JSON form crosses vLLM's worker RPC,
which takes strings and plain values only.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass

from tandem.weight_plan import BucketPlan, GroupSpec, TensorSpec


@dataclass(frozen=True)
class CollectiveSource:
    """Receive over the weight-sync group `group`, as `rank` (generators take 1..world_size-1)."""

    group: GroupSpec
    rank: int
    plan: BucketPlan

    def __post_init__(self) -> None:
        if not 1 <= self.rank < self.group.world_size:
            raise ValueError(f"generators take ranks 1..{self.group.world_size - 1} of the group, got {self.rank}")


@dataclass(frozen=True)
class SharedMemorySource:
    """Load the HF safetensors files in `directory` (shared memory on this host)."""

    directory: str


@dataclass(frozen=True)
class CudaIpcSource:
    """Read the trainer's buckets in place: buckets[i] is the CUDA IPC handle (tandem.cuda_ipc
    payload) of bucket i of `plan`, valid until the load returns."""

    buckets: tuple[bytes, ...]
    plan: BucketPlan

    def __post_init__(self) -> None:
        if len(self.buckets) != len(self.plan.bucket_sizes_bytes):
            raise ValueError(f"{len(self.buckets)} CUDA IPC handles for a plan of "
                             f"{len(self.plan.bucket_sizes_bytes)} buckets")


WeightSource = CollectiveSource | SharedMemorySource | CudaIpcSource
_KINDS = {CollectiveSource: "collective", SharedMemorySource: "shared_memory", CudaIpcSource: "cuda_ipc"}


def source_to_json(source: WeightSource) -> str:
    fields = dataclasses.asdict(source)
    if isinstance(source, CudaIpcSource):
        fields["buckets"] = [base64.b64encode(b).decode() for b in source.buckets]
    return json.dumps({"kind": _KINDS[type(source)], **fields})


_FROM_JSON = {  # the inverse of _KINDS: a source's fields (less its kind) -> the source
    "shared_memory": lambda raw: SharedMemorySource(**raw),
    "collective": lambda raw: CollectiveSource(GroupSpec(**raw["group"]), raw["rank"], plan_from_dict(raw["plan"])),
    "cuda_ipc": lambda raw: CudaIpcSource(tuple(base64.b64decode(b) for b in raw["buckets"]),
                                          plan_from_dict(raw["plan"])),
}


def source_from_json(text: str) -> WeightSource:
    raw = json.loads(text)
    kind = raw.pop("kind")
    if not isinstance(kind, str) or kind not in _FROM_JSON:
        raise ValueError(f"unknown weight source kind {kind!r}")
    return _FROM_JSON[kind](raw)


def plan_from_dict(raw: dict) -> BucketPlan:
    tensors = tuple(TensorSpec(**{**t, "shape": tuple(t["shape"])}) for t in raw["tensors"])
    return BucketPlan(tensors, tuple(raw["bucket_sizes_bytes"]), tuple(raw.get("window_ends", ())))
