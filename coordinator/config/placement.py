"""Which GPUs of a node each service takes, decided once when the config loads (local launch:
every service on this host; `tandem slurm` gives dedicated generators nodes of their own and
asks Slurm for their GPUs, coordinator/launch/slurm.py).

    trainer            GPUs 0..R-1 (R = cluster.trainer_ranks), one per torchrun rank
    dedicated          the next free GPUs, one per vLLM worker (tensor x pipeline parallel),
    generators         generator after generator; on a one-GPU node they share GPU 0 with the
                       trainer (weights then travel by CUDA IPC, not over NCCL, which refuses
                       two ranks on one device)
    colocated          the trainer's first GPUs (each vLLM worker on one trainer rank's GPU)
    generators

Each process sees its GPUs alone (CUDA_VISIBLE_DEVICES), so vLLM's workers and the trainer's
ranks count their devices from 0. On a CPU node (cluster.gpus_per_node 0) nothing is placed
and no environment is set. A layout that does not fit raises, naming the keys.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GeneratorDevices:
    devices: tuple[int, ...]
    """The node's GPUs this generator's vLLM workers take, worker i on devices[i] (empty on CPU)."""
    shares_trainer_device: bool
    """Its first GPU is one of the trainer's (colocated, or a one-GPU node)."""


@dataclass(frozen=True)
class Placement:
    gpus_per_node: int
    trainer: tuple[int, ...]
    """The GPUs of the trainer's ranks on this node, rank i on trainer[i] (empty on CPU)."""
    generators: tuple[GeneratorDevices, ...]

    @property
    def generators_share_trainer_device(self) -> bool:
        """Weights reach the generators through CUDA IPC on the trainer's device (tandem.colocation)."""
        return any(g.shares_trainer_device for g in self.generators)

    def trainer_env(self) -> dict[str, str]:
        return _visible(self.trainer)

    def generator_env(self, index: int) -> dict[str, str]:
        return _visible(self.generators[index].devices)


def _visible(devices: tuple[int, ...]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))} if devices else {}


class PlacementError(ValueError):
    """The services do not fit the node's GPUs."""


def place(gpus_per_node: int, trainer_ranks: int, generators: int, workers_per_generator: int,
          colocated: bool) -> Placement:
    """The placement of a trainer of `trainer_ranks` ranks and `generators` generators of
    `workers_per_generator` vLLM workers each on one node of `gpus_per_node` GPUs."""
    if not gpus_per_node:
        return Placement(0, (), tuple(GeneratorDevices((), False) for _ in range(generators)))
    if trainer_ranks > gpus_per_node:
        raise PlacementError(f"cluster.trainer_ranks ({trainer_ranks}) exceeds cluster.gpus_per_node "
                             f"({gpus_per_node}): the trainer takes one GPU per rank")
    trainer = tuple(range(trainer_ranks))
    if colocated:
        if workers_per_generator > trainer_ranks:
            raise PlacementError(
                f"colocated generators run on the trainer's GPUs: policy.generation.vllm_cfg tensor_parallel_size x "
                f"pipeline_parallel_size ({workers_per_generator}) must not exceed cluster.trainer_ranks "
                f"({trainer_ranks})")
        shared = GeneratorDevices(trainer[:workers_per_generator], True)
        return Placement(gpus_per_node, trainer, tuple(shared for _ in range(generators)))
    free = gpus_per_node - trainer_ranks
    need = generators * workers_per_generator
    if need <= free:
        return Placement(gpus_per_node, trainer, tuple(
            GeneratorDevices(tuple(range(trainer_ranks + i * workers_per_generator,
                                         trainer_ranks + (i + 1) * workers_per_generator)), False)
            for i in range(generators)))
    if gpus_per_node == 1 and workers_per_generator == 1:  # one GPU: dedicated generators share it
        return Placement(1, trainer, tuple(GeneratorDevices((0,), True) for _ in range(generators)))
    raise PlacementError(
        f"dedicated generators do not fit: cluster.trainer_ranks ({trainer_ranks}) + cluster.num_generators "
        f"({generators}) x policy.generation.vllm_cfg tensor_parallel_size x pipeline_parallel_size "
        f"({workers_per_generator}) = {trainer_ranks + need} GPUs, cluster.gpus_per_node is {gpus_per_node}: lower "
        "cluster.trainer_ranks or cluster.num_generators, or set policy.generation.colocated.enabled=true")
