"""Batch layout shared by the backends: validation, rank shards, micro-batches, collation.

Conventions (also stated on `TrainerBackend`):
- Sequences are right-padded to the longest one of the micro-batch with `pad_id`; because
  attention is causal, real tokens never see the padding, so no attention mask is needed.
- Token-aligned tensors are [B, T-1]: column j belongs to token j+1, predicted from
  tokens 0..j. Completion token k of a sample with prompt length P sits in column P-1+k.
- The logprobs returned for a sample are `logprobs[k] = log p(token_ids[P+k] | token_ids[:P+k])`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer_svc.types import Sample


def validate_samples(samples: Sequence[Sample], vocab_size: int, *, need_generation_logprobs: bool) -> None:
    """Raise ValueError naming the first malformed sample."""
    if not samples:
        raise ValueError("the batch has no samples")
    for i, s in enumerate(samples):
        n = s.completion_length
        if s.prompt_length < 1:
            raise ValueError(f"sample {i}: prompt_length must be >= 1 (at least BOS), got {s.prompt_length}")
        if n < 1:
            raise ValueError(f"sample {i}: no completion tokens ({len(s.token_ids)} tokens, prompt_length {s.prompt_length})")
        if min(s.token_ids) < 0 or max(s.token_ids) >= vocab_size:
            raise ValueError(f"sample {i}: token ids must lie in [0, {vocab_size})")
        if s.loss_mask is not None and len(s.loss_mask) != n:
            raise ValueError(f"sample {i}: loss_mask has {len(s.loss_mask)} entries for {n} completion tokens")
        if s.generation_logprobs is not None and len(s.generation_logprobs) not in (0, n):
            raise ValueError(f"sample {i}: generation_logprobs has {len(s.generation_logprobs)} entries "
                             f"for {n} completion tokens")
        if need_generation_logprobs and not s.generation_logprobs:
            raise ValueError(f"sample {i}: the GRPO loss needs generation_logprobs for every completion token")


def validate_train_layout(num_samples: int, global_batch_size: int, micro_batch_size: int, world_size: int) -> None:
    """The batch must split into whole optimizer steps and every rank into equal shards."""
    if global_batch_size <= 0 or micro_batch_size <= 0:
        raise ValueError(f"global_batch_size ({global_batch_size}) and micro_batch_size ({micro_batch_size}) must be > 0")
    if num_samples % global_batch_size:
        raise ValueError(f"{num_samples} samples do not split into optimizer steps of global_batch_size {global_batch_size}")
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size {global_batch_size} must be a multiple of the {world_size} trainer ranks")


def optimizer_steps(samples: Sequence[Sample], global_batch_size: int) -> list[Sequence[Sample]]:
    """The global batch of each optimizer step, in order."""
    return [samples[i:i + global_batch_size] for i in range(0, len(samples), global_batch_size)]


def rank_shard(samples: Sequence[Sample], rank: int, world_size: int) -> Sequence[Sample]:
    """This rank's contiguous share; ranks before the last get ceil(n / world_size) samples."""
    per_rank = -(-len(samples) // world_size)
    return samples[rank * per_rank:(rank + 1) * per_rank]


def micro_batches(samples: Sequence[Sample], micro_batch_size: int) -> list[Sequence[Sample]]:
    return [samples[i:i + micro_batch_size] for i in range(0, len(samples), micro_batch_size)]


def count_loss_tokens(samples: Sequence[Sample]) -> int:
    """Masked-in completion tokens: the global normaliser of an optimizer step."""
    return int(sum(s.completion_length if s.loss_mask is None else sum(1 for m in s.loss_mask if m > 0)
                   for s in samples))


@dataclass(frozen=True)
class MicroBatch:
    """A collated micro-batch: input_ids [B, T]; the other tensors [B, T-1] (see module doc)."""

    input_ids: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    generation_logprobs: torch.Tensor
    prompt_lengths: tuple[int, ...]
    lengths: tuple[int, ...]


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device) -> MicroBatch:
    """Right-pad `samples` into token-aligned tensors on `device`."""
    width = max(len(s.token_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), width - 1)
    advantages = torch.zeros(len(samples), width - 1)
    generation = torch.zeros(len(samples), width - 1)
    for i, s in enumerate(samples):
        n, start = s.completion_length, s.prompt_length - 1
        ids[i, :len(s.token_ids)] = torch.as_tensor(list(s.token_ids), dtype=torch.long)
        mask[i, start:start + n] = 1.0 if s.loss_mask is None else (torch.as_tensor(list(s.loss_mask)) > 0).float()
        advantages[i, start:start + n] = float(s.advantage)
        if s.generation_logprobs:
            generation[i, start:start + n] = torch.as_tensor(list(s.generation_logprobs), dtype=torch.float32)
    return MicroBatch(ids.to(device), mask.to(device), advantages.to(device), generation.to(device),
                      tuple(s.prompt_length for s in samples), tuple(len(s.token_ids) for s in samples))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits and [B, T] ids -> [B, T-1] float32 logprobs of tokens 1..T-1."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def completion_logprobs(logprobs: torch.Tensor, batch: MicroBatch) -> list[list[float]]:
    """Per sample, the [B, T-1] logprobs of its completion tokens as plain lists."""
    rows = logprobs.detach().float().cpu()
    return [rows[i, p - 1:n - 1].tolist() for i, (p, n) in enumerate(zip(batch.prompt_lengths, batch.lengths))]
