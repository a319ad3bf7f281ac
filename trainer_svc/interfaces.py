"""The contract between the trainer engine and a training backend (DTensor/FSDP2, Megatron).

Every method is SPMD: the engine calls it on every rank, in the same order, with the same
arguments (the whole batch on every rank); the backend takes its own shard. Results that
the caller needs come back on rank 0 only (None elsewhere).

Tensor and batch conventions:
- Samples are right-padded within a micro-batch; attention is causal, so real tokens never
  see padding (no attention mask).
- Logprob alignment: for a sample with prompt length P,
  `logprobs[i] = log p(token_ids[P + i] | token_ids[:P + i])`, one per completion token
  (len(token_ids) - P values), computed in float32 from the logits.
- Inside a backend, token-aligned tensors are [B, T-1] with column j holding token j+1
  (see `trainer_svc.batching` and `trainer_svc.losses`).
- Loss normalisation is global: each micro-batch divides its masked token sum by the number
  of masked-in tokens of the whole optimizer step on all ranks, and gradients are SUMMED
  across ranks, so results do not depend on the split into micro-batches or ranks.
- Preference losses (`LossKind.paired` in `trainer_svc.types.LOSSES`: DPO, Bradley-Terry): samples[2k] is chosen and
  samples[2k + 1] rejected; a backend keeps each pair whole and in order in one micro-batch
  (the engine has checked that contiguous shards and micro-batches do) and normalises by the
  step's sequence count (pairs = sequences / 2). A loss with `takes_sequence_scores` (Bradley-
  Terry) gets the model's scalar output per row [B] instead of token logprobs.
- A backend built with `reward_model_cfg.enabled` holds a one-output sequence classifier (HF's
  pooling: the score at each row's last non-pad token) and trains it with Bradley-Terry only.
- A backend built with `value_model_cfg.enabled` (a PPO critic; DTensor only) holds a one-output
  token classifier: a value per position, [B, T-1] in the logprobs' layout, trained with the value loss only.

- Full state dicts use Hugging Face parameter names and full (unsharded) CPU tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import torch

from tandem.weight_plan import BucketPlan
from trainer_svc.config import TrainingBackend
from trainer_svc.held_bytes import HeldBytes
from trainer_svc.types import LossConfig, Policy, Sample, StepResult


class TrainerBackend(Protocol):
    """A policy (and its frozen reference) trained over all ranks of the default process group."""

    rank: int
    """This process's rank in the trainer's world."""
    world_size: int
    """Number of torchrun ranks."""
    device: torch.device
    """Device of this rank's compute."""
    backend_kind: TrainingBackend
    """Which backend this is (reported by GetInfo)."""
    vocab_size: int
    """Size of the model's vocabulary; token ids must lie in [0, vocab_size)."""
    num_parameters: int
    """Number of (unique) parameters of the policy."""
    hf_tensor_shapes: dict[str, tuple[int, ...]]
    """HF names and full shapes of the tensors that `gather_hf_state_dict` returns, in the
    order `iter_hf_tensors` yields them (the bucket plan's; tied duplicates left out, as
    `save_pretrained` does)."""
    published_tensor_shapes: dict[str, tuple[int, ...]]
    """Names and full shapes of what a weight publish carries, in `iter_published_tensors` order
    (the bucket plan's): `hf_tensor_shapes`, or with LoRA's `weight_sync: adapter` the adapters'
    (PEFT's saved names)."""
    held_bytes: HeldBytes
    """Bytes of gathered full weights this rank holds, with their peak (instrumentation of the
    export: a streamed publish holds about one tensor, a whole state dict the whole model)."""
    checkpoint_dtype: torch.dtype
    """dtype of the loaded HF checkpoint (what an export writes)."""
    global_step: int
    """Optimizer steps taken since the start or the loaded checkpoint."""

    def compute_logprobs(self, samples: Sequence[Sample], policy: Policy,
                         micro_batch_size: int) -> list[list[float]] | None:
        """Completion-token logprobs of every sample (alignment above) under `policy`.

        Samples are split across ranks; rank 0 returns one list per sample, in order.
        """
        ...

    def compute_values(self, samples: Sequence[Sample], micro_batch_size: int) -> list[list[float]] | None:
        """A value model's (value_model_cfg.enabled: a PPO critic's) value of each completion token's
        state, aligned as `compute_logprobs`'s rows: values[i] is the model's scalar at the position
        of token_ids[P+i-1], the state token P+i is sampled from. Rank 0 returns them, in order."""
        ...

    def train_step(self, samples: Sequence[Sample], loss: LossConfig, global_batch_size: int,
                   micro_batch_size: int, learning_rate: float | None) -> StepResult:
        """len(samples) / global_batch_size optimizer steps over consecutive slices, at
        `learning_rate` (None: the configured one; the configured one applies again after).

        First the previous-policy (and, if the loss needs them, reference) logprobs of the
        whole batch are computed with the weights at entry; then each optimizer step runs
        forward/backward over this rank's micro-batches, clips and steps. Metrics are
        averaged over optimizer steps (num_tokens summed), identical on every rank.
        """
        ...

    def iter_hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective generator: the full tensors of the current policy in HF names, one at a
        time in `hf_tensor_shapes` order, yielded on rank 0 (on its device or the CPU); the
        other ranks yield nothing. Every rank must exhaust it (each item may be a collective)."""
        ...

    def iter_published_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective generator, as `iter_hf_tensors`, of what a weight publish carries (in
        `published_tensor_shapes` order): the HF tensors, or the LoRA adapters alone."""
        ...

    def keep_published_in(self, plan: BucketPlan) -> bool:
        """At start, once: move the parameters a publish carries into one block of memory laid out
        as `plan` (tandem.weight_sync.plan_block_views), when this rank holds every one of them
        whole, as a plain tensor in the plan's dtype, and yields them as such; returns whether it
        did. Then every bucket is broadcast from the parameters' own memory (no copy), and a few
        large buckets carry the model (trainer_svc/publish.py)."""
        ...

    def gather_hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: full CPU tensors of the current policy in HF names on rank 0, else None
        (the whole model at once: for HF export; publishing streams `iter_hf_tensors`)."""
        ...

    def export_adapter(self, path: Path) -> int:
        """Collective: the LoRA adapters alone, in PEFT's layout, into directory `path` (rank 0),
        beside an HF export of the merged weights; returns the adapter tensors written (0 on
        other ranks, and where nothing trains adapters: nothing is written then)."""
        ...

    def save_checkpoint(self, path: Path, *, background: bool = False) -> None:
        """Collective: write model, optimizer, RNG and step (sharded) into directory `path`. With
        `background` it may return before the bytes are on disk (`checkpoint_written` says when);
        the backend keeps what it writes unchanged until then."""
        ...

    def checkpoint_written(self, path: Path, timeout_s: float) -> bool:
        """Rank 0, beside the commands (no collective): wait up to timeout_s for the save into
        `path` to be on disk on every rank and mark it complete; whether it is."""
        ...

    def load_checkpoint(self, path: Path) -> int:
        """Collective: restore what `save_checkpoint` wrote; returns the restored global step."""
        ...

    def close(self) -> None:
        """Drop what the backend holds (before the process groups are destroyed); it is unusable afterwards."""
        ...
