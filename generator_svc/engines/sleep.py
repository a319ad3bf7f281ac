"""Sleep of generators that share memory with the trainer: what the engine has released and
what it may do meanwhile, plus the memory arguments the engine starts with.

Two kinds (SleepMode):
- vLLM's sleep mode, for colocated generators on a GPU (level 1: weights offloaded to host
  memory, KV cache discarded; level 2: both discarded) frees the device for the trainer. While
  anything sleeps, Generate is refused; a new version may be loaded once the weights are awake
  (the coordinator wakes weights, publishes, then wakes the KV cache, and generation resumes
  with the last wake-up).
- On CPU vLLM has no sleep mode. A generator started with free_weights_while_training frees its
  weights itself at level 2 (generator_svc/worker_extension.py RELEASE); the KV cache stays,
  nothing is asleep, and the next version loaded is the wake-up. Generate is refused meanwhile.
A generator with neither refuses Sleep instead of pretending.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any, get_args

from generator_svc.config import GeneratorSettings, kv_cache_memory_bytes
from tandem.colocation import FREE_WEIGHTS_LEVEL, resolve_colocation
from tandem.generation.types import MemoryKind
from tandem.rpc import FailedPrecondition

ALL_MEMORY: tuple[MemoryKind, ...] = get_args(MemoryKind)


def memory_args(settings: GeneratorSettings, device_type: str) -> dict[str, Any]:
    """vLLM engine arguments for the device memory: on CUDA its share of the GPU and sleep mode
    where colocated (tandem.colocation decides); on CPU the KV cache's bytes, sized from the
    workload unless kv_cache_space_gib sets VLLM_CPU_KVCACHE_SPACE (generator_svc/config.py)."""
    if device_type != "cuda":
        kv = kv_cache_memory_bytes(settings)
        return {} if kv is None else {"kv_cache_memory_bytes": kv}
    return {"gpu_memory_utilization": settings.gpu_memory_utilization,
            "enable_sleep_mode": resolve_colocation(settings.colocated, device_type).sleeps}


class SleepMode(Enum):
    NONE = "none"
    """Sleep is refused."""
    VLLM = "vllm"
    """vLLM's sleep mode (GPUs)."""
    FREE_WEIGHTS = "free_weights"
    """Level 2 only, done by Tandem: the weights are freed, the KV cache kept (CPU)."""


def sleep_mode(settings: GeneratorSettings, device_type: str, vllm_sleeps: bool) -> SleepMode:
    if vllm_sleeps:
        return SleepMode.VLLM
    if device_type == "cpu" and settings.free_weights_while_training:
        return SleepMode.FREE_WEIGHTS
    return SleepMode.NONE


class SleepState:
    """The memory a generator has released, and the checks that follow from it."""

    def __init__(self, mode: SleepMode) -> None:
        self.mode = mode
        self._asleep: set[MemoryKind] = set()
        self._weights_discarded = False  # level 2: the weights are gone until a version is loaded

    @property
    def enabled(self) -> bool:
        return self.mode is not SleepMode.NONE

    @property
    def asleep(self) -> tuple[MemoryKind, ...]:
        return tuple(kind for kind in ALL_MEMORY if kind in self._asleep)

    def check_sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (weights to host memory) or 2 (weights discarded), got {level}")
        if self.mode is SleepMode.NONE:
            raise FailedPrecondition("this generator runs without vLLM sleep mode (it is enabled only for colocated "
                                     "generators on a GPU) and without free_weights_while_training (CPU): there is "
                                     "nothing to sleep")
        if self.mode is SleepMode.FREE_WEIGHTS and level != FREE_WEIGHTS_LEVEL:
            raise FailedPrecondition(f"a CPU generator can only free its weights (level {FREE_WEIGHTS_LEVEL}); level "
                                     f"{level} would offload them to host memory, where they are already")

    def slept(self, level: int) -> None:
        if self.mode is SleepMode.VLLM:
            self._asleep = set(ALL_MEMORY)
        self._weights_discarded = level == 2

    def to_wake(self, memory: Sequence[MemoryKind] | None) -> list[MemoryKind]:
        """The asleep kinds among `memory` (None or empty: all), in vLLM's order."""
        wanted = set(memory or ALL_MEMORY)
        unknown = wanted - set(ALL_MEMORY)
        if unknown:
            raise ValueError(f"unknown memory kinds {sorted(unknown)}; known: {list(ALL_MEMORY)}")
        return [kind for kind in ALL_MEMORY if kind in wanted and kind in self._asleep]

    def woke(self, kinds: Sequence[MemoryKind]) -> None:
        self._asleep -= set(kinds)

    def loaded(self) -> None:
        """A complete version was loaded into the (awake) weights."""
        self._weights_discarded = False

    def check_can_generate(self) -> None:
        if self._asleep:
            raise FailedPrecondition(f"the generator is asleep ({', '.join(self.asleep)} released for the colocated "
                                     "trainer): wake it up before sending work")
        if self._weights_discarded:
            raise FailedPrecondition("a level-2 sleep freed the weights: publish a version before sending work")

    def check_can_load(self) -> None:
        if "weights" in self._asleep:
            raise FailedPrecondition("the generator's weights are asleep: wake up the weights before loading a version")
