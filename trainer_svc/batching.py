"""Batch layout shared by the backends: validation, rank shards, micro-batches, collation.

Conventions (also stated on `TrainerBackend`):
- Sequences are right-padded to the longest one of the micro-batch with `pad_id`; because
  attention is causal, real tokens never see the padding, so no attention mask is needed.
- Token-aligned tensors are [B, T-1]: column j belongs to token j+1, predicted from
  tokens 0..j. Completion token k of a sample with prompt length P sits in column P-1+k.
- The logprobs returned for a sample are `logprobs[k] = log p(token_ids[P+k] | token_ids[:P+k])`.

Sequence packing (`pack`): the micro-batch's samples are also concatenated into one row
[1, T] whose position ids restart at 0 for every sample; HF attention turns restarting
position ids into a block-diagonal causal mask (only without a KV cache: call the model with
use_cache=False), so no token attends across samples. The
model runs on the packed row; `unpack_logprobs` scatters its [1, T-1] logprobs back into the
padded [B, T-1] layout above, so losses (token- and sequence-level) see exactly the tensors of
the unpacked path. The packed column that predicts a sample's first token from the previous
sample is never used: a sample's first token is a prompt token (prompt_length >= 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from trainer_svc.types import Sample


def validate_samples(samples: Sequence[Sample], vocab_size: int, *, need_generation_logprobs: bool,
                     need_teacher_logprobs: bool = False, need_value_targets: bool = False) -> None:
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
        if s.teacher_logprobs and len(s.teacher_logprobs) != n:
            raise ValueError(f"sample {i}: teacher_logprobs has {len(s.teacher_logprobs)} entries "
                             f"for {n} completion tokens")
        if need_teacher_logprobs and not s.teacher_logprobs:
            raise ValueError(f"sample {i}: the distillation loss needs teacher_logprobs for every completion token")
        for name in ("token_advantages", "returns", "values"):
            if (row := getattr(s, name)) and len(row) != n:
                raise ValueError(f"sample {i}: {name} has {len(row)} entries for {n} completion tokens")
        if need_value_targets and not (s.returns and s.values):
            raise ValueError(f"sample {i}: the value loss needs returns and values for every completion token")


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
class PackedRow:
    """The samples of a micro-batch concatenated into one row (see module doc).

    input_ids, position_ids: [1, T] with T the sum of the sample lengths.
    columns: [B, Tu-1] long, for each column of the padded layout the packed column holding
        the same token (0 on padding columns, which the mask zeroes).
    mask: [1, T-1] the loss mask in the packed layout (entropy is summed over it).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    columns: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True)
class MicroBatch:
    """A collated micro-batch: input_ids [B, T]; the other tensors [B, T-1] (see module doc).
    `packed` is set when the model runs on the samples concatenated into one row."""

    input_ids: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    generation_logprobs: torch.Tensor
    prompt_lengths: tuple[int, ...]
    lengths: tuple[int, ...]
    packed: PackedRow | None = None
    teacher_logprobs: torch.Tensor | None = None
    """A distillation teacher's logprobs of the tokens (None: no sample carries them)."""
    returns: torch.Tensor | None = None
    """A critic's value targets (None: no sample carries them)."""
    old_values: torch.Tensor | None = None
    """The critic's values at rollout time (None: no sample carries them)."""


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device) -> MicroBatch:
    """Right-pad `samples` into token-aligned tensors on `device`."""
    width = max(len(s.token_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), width - 1)
    advantages = torch.zeros(len(samples), width - 1)
    generation = torch.zeros(len(samples), width - 1)
    teacher = torch.zeros(len(samples), width - 1) if any(s.teacher_logprobs for s in samples) else None
    returns = torch.zeros(len(samples), width - 1) if any(s.returns for s in samples) else None
    old_values = torch.zeros(len(samples), width - 1) if any(s.values for s in samples) else None
    for i, s in enumerate(samples):
        n, start = s.completion_length, s.prompt_length - 1
        ids[i, :len(s.token_ids)] = torch.as_tensor(list(s.token_ids), dtype=torch.long)
        mask[i, start:start + n] = 1.0 if s.loss_mask is None else (torch.as_tensor(list(s.loss_mask)) > 0).float()
        if s.token_advantages:  # PPO: one per token (GAE)
            advantages[i, start:start + n] = torch.as_tensor(list(s.token_advantages), dtype=torch.float32)
        else:
            advantages[i, start:start + n] = float(s.advantage)
        if returns is not None and s.returns:
            returns[i, start:start + n] = torch.as_tensor(list(s.returns), dtype=torch.float32)
        if old_values is not None and s.values:
            old_values[i, start:start + n] = torch.as_tensor(list(s.values), dtype=torch.float32)
        if s.generation_logprobs:
            generation[i, start:start + n] = torch.as_tensor(list(s.generation_logprobs), dtype=torch.float32)
        if teacher is not None and s.teacher_logprobs:
            teacher[i, start:start + n] = torch.as_tensor(list(s.teacher_logprobs), dtype=torch.float32)
    return MicroBatch(ids.to(device), mask.to(device), advantages.to(device), generation.to(device),
                      tuple(s.prompt_length for s in samples), tuple(len(s.token_ids) for s in samples),
                      teacher_logprobs=None if teacher is None else teacher.to(device),
                      returns=None if returns is None else returns.to(device),
                      old_values=None if old_values is None else old_values.to(device))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits and [B, T] ids -> [B, T-1] float32 logprobs of tokens 1..T-1."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def completion_logprobs(logprobs: torch.Tensor, batch: MicroBatch) -> list[list[float]]:
    """Per sample, the [B, T-1] logprobs of its completion tokens as plain lists."""
    rows = logprobs.detach().float().cpu()
    return [rows[i, p - 1:n - 1].tolist() for i, (p, n) in enumerate(zip(batch.prompt_lengths, batch.lengths))]


def pack(samples: Sequence[Sample], pad_id: int, device: torch.device) -> MicroBatch:
    """`collate(samples)` plus the packed row the model runs on (see module doc)."""
    batch = collate(samples, pad_id, device)
    lengths = [len(s.token_ids) for s in samples]
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    ids = torch.as_tensor([t for s in samples for t in s.token_ids], dtype=torch.long)
    positions = torch.cat([torch.arange(n) for n in lengths])
    width = batch.input_ids.shape[1] - 1
    columns = torch.zeros(len(samples), width, dtype=torch.long)
    for i, (start, n) in enumerate(zip(starts, lengths)):
        columns[i, :n - 1] = torch.arange(start, start + n - 1)
    mask = torch.zeros(1, len(ids) - 1)
    mask[0].index_put_((columns.flatten(),), batch.mask.cpu().flatten(), accumulate=True)
    packed = PackedRow(ids[None].to(device), positions[None].to(device), columns.to(device), mask.to(device))
    return MicroBatch(batch.input_ids, batch.mask, batch.advantages, batch.generation_logprobs,
                      batch.prompt_lengths, batch.lengths, packed, batch.teacher_logprobs, batch.returns,
                      batch.old_values)



def unpack_logprobs(packed_logprobs: torch.Tensor, packed: PackedRow) -> torch.Tensor:
    """[1, T-1] logprobs of a packed row -> [B, Tu-1] in the padded layout (finite on padding)."""
    return packed_logprobs[0][packed.columns]


PackingAlgorithm = Literal["first_fit_decreasing", "concatenative"]


def pack_bins(lengths: Sequence[int], max_tokens: int, algorithm: PackingAlgorithm) -> list[list[int]]:
    """Group indices into bins of at most `max_tokens` tokens (a longer sample gets a bin alone).

    first_fit_decreasing: longest first, each into the first bin with room (fewest bins);
    concatenative: in order, a new bin whenever the next sample does not fit.
    Indices are ascending within each bin.
    """
    if max_tokens <= 0:
        raise ValueError(f"the packing token budget must be > 0, got {max_tokens}")
    order = range(len(lengths))
    if algorithm == "first_fit_decreasing":
        order = sorted(order, key=lambda i: (-lengths[i], i))
    elif algorithm != "concatenative":
        raise ValueError(f"unknown packing algorithm {algorithm!r}: use first_fit_decreasing or concatenative")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        candidates = range(len(bins)) if algorithm == "first_fit_decreasing" else range(len(bins) - 1, len(bins))
        target = next((b for b in candidates if b >= 0 and room[b] >= n), None)
        if target is None:
            bins.append([])
            room.append(max_tokens)
            target = len(bins) - 1
        bins[target].append(i)
        room[target] -= n
    return [sorted(b) for b in bins]


def rank_micro_batches(samples: Sequence[Sample], rank: int, world_size: int,
                       split: Callable[[Sequence[Sample]], list[list[int]]]) -> tuple[Sequence[Sample], list[list[int]]]:
    """This rank's shard and its micro-batches as index lists into it, padded with empty lists
    so every rank runs the same number of forwards (each is a collective under FSDP)."""
    groups = [split(rank_shard(samples, r, world_size)) for r in range(world_size)]
    count = max(len(g) for g in groups)
    return rank_shard(samples, rank, world_size), groups[rank] + [[] for _ in range(count - len(groups[rank]))]
