"""The generator contract (`tandem.generation.engine.GenerationEngine`) over the trainer's own
model: what trainer rank 0 serves as `tandem.generator.v1.GeneratorService` with
policy.generation.backend megatron, so the coordinator routes rollouts to it like to any
generator.

Calls run on the trainer's single engine thread, the one that runs every other trainer
command, so generation and training take turns; each generate call is one lockstep command
over all ranks (`trainer_svc.decode`). Weights never travel: the version served is the
trainer's own published one (a publish to a group of the trainer alone makes a version the
trainer's), and a call refuses to run on weights a train step moved past it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from importlib.metadata import version

from tandem.generation.types import Completion, GeneratorInfo, MemoryKind, SamplingConfig
from tandem.rpc import FailedPrecondition
from tandem.weight_source import CollectiveSource, WeightSource
from trainer_svc.config import TrainerSettings
from trainer_svc.decode import DecodeSink
from trainer_svc.engine import TrainerEngine

_DONE = object()


class TrainerGenerationEngine:
    """Rank 0's generation engine: validates, queues on the engine thread, streams completions."""

    def __init__(self, trainer: TrainerEngine, executor: Executor, *, engine: str, dtype: str, max_num_seqs: int,
                 max_model_len: int):
        self._trainer = trainer
        self._executor = executor
        self._engine = engine
        self._dtype = dtype
        self._max_num_seqs = max_num_seqs
        self._max_model_len = max_model_len
        self._num_running = 0
        self._closed = False

    @classmethod
    def build(cls, trainer: TrainerEngine, settings: TrainerSettings, executor: Executor) -> TrainerGenerationEngine:
        """The engine of a trainer started with settings.generation.enabled (Megatron backend)."""
        return cls(trainer, executor, engine=f"megatron-core {version('megatron-core')} (trainer)",
                   dtype=settings.dtype, max_num_seqs=settings.generation.max_num_seqs,
                   max_model_len=settings.generation.max_model_len)

    def _check(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> None:
        vocab = self._trainer.vocab_size
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise ValueError(f"prompt {i} has a token id outside [0, {vocab})")
            if len(prompt) + sampling.max_tokens > self._max_model_len:
                raise ValueError(f"prompt {i} ({len(prompt)} tokens) + max_tokens ({sampling.max_tokens}) exceeds "
                                 f"max_model_len {self._max_model_len}")

    async def score(self, sequences: Sequence, top_k: int = 0, request_id: str = "") -> list:
        """Not served here: a distillation teacher is a generator service of its own."""
        raise FailedPrecondition("the trainer's own generation does not score tokens; a distillation teacher is a "
                                 "generator service (distillation.teacher)")

    async def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                       request_id: str = "") -> AsyncIterator[Completion]:
        if self._closed:
            raise ConnectionError("the trainer's generation is draining: no new calls")
        self._check(prompts, sampling)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        aborted = threading.Event()
        def emit(completion: Completion) -> None:  # on the engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, completion)
            except RuntimeError:  # the event loop is gone (shutdown): nobody waits for the rest
                aborted.set()

        sink = DecodeSink(emit, aborted.is_set)
        rows = len(prompts) * sampling.n
        self._num_running += rows
        try:
            call = loop.run_in_executor(self._executor, self._trainer.generate, prompts, sampling, sink)
            call.add_done_callback(lambda _: queue.put_nowait(_DONE))  # after the completions (FIFO)
            while (item := await queue.get()) is not _DONE:
                yield item
            call.result()  # the call's error, if it failed part-way
        finally:
            aborted.set()  # closed early: rank 0 stops the decode at its next step
            self._num_running -= rows

    async def load_weights(self, source: WeightSource, version: int) -> int:
        """Nothing to read: the weights are the trainer's. Acknowledges `version` if the trainer
        serves it (a publish to a group of the trainer alone made it so); refuses anything else."""
        if not isinstance(source, CollectiveSource) or version != self._trainer.weight_version:
            raise FailedPrecondition(f"this generator serves the trainer's own weights (version "
                                     f"{self._trainer.weight_version}); version {version} comes from a publish to "
                                     "the trainer, not to it")
        return version

    async def sleep(self, level: int) -> tuple[MemoryKind, ...]:
        raise FailedPrecondition("this generator is the trainer itself: it has no sleep mode")

    async def wake_up(self, memory: Sequence[MemoryKind] | None = None) -> tuple[MemoryKind, ...]:
        return ()  # never asleep

    def info(self) -> GeneratorInfo:
        return GeneratorInfo(model_name=self._trainer.model_name, weight_version=self._trainer.weight_version,
                             engine=self._engine, dtype=self._dtype, max_num_seqs=self._max_num_seqs,
                             num_running=self._num_running)

    @property
    def serving(self) -> bool:
        return True  # the weights are always a known version; moved ones are refused per call

    @property
    def dead(self) -> bool:
        return False  # it dies with the trainer process

    async def drain(self, timeout_s: float) -> bool:
        self._closed = True
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._num_running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return self._num_running == 0

    async def close(self) -> None:
        self._closed = True
