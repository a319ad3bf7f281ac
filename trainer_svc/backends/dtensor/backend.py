"""DTensorBackend: logprobs, GRPO/NLL optimizer steps, full-state gather and DCP checkpoints
for an FSDP2-sharded HF causal LM (conventions in `trainer_svc.interfaces`).

The reference policy is the initial weights, kept as a second copy of this rank's shards and
swapped into the live parameters (in place, exactly) for the duration of a reference pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from tandem.weight_plan import BucketPlan
from tandem.weight_sync import plan_block_views
from trainer_svc.backends.dtensor import checkpoint, lora
from trainer_svc.backends.dtensor.model import dropout_free, load_sharded_policy
from trainer_svc.backends.dtensor.parallel import (
    MeshAxis,
    ParallelDims,
    clip_grad_norm,
    local_value,
    offload_policy,
    resolve_parallel_plan,
)
from trainer_svc.backends.reference import ReferenceWeights
from trainer_svc.batching import (
    MicroBatch,
    collate,
    completion_logprobs,
    count_loss_tokens,
    optimizer_steps,
    pack,
    pack_bins,
    rank_micro_batches,
    token_logprobs,
    unpack_logprobs,
)
from trainer_svc.config import TrainerSettings, TrainingBackend
from trainer_svc.config.lora import LoraWeightSync
from trainer_svc.distributed import DistEnv
from trainer_svc.held_bytes import HeldBytes
from trainer_svc.losses import (
    LossFn,
    LossInputs,
    build_loss_fn,
    count_loss_sequences,
    masked_entropy_sum,
    previous_logprobs_needed,
)
from trainer_svc.types import LossConfig, Policy, Sample, StepResult


class DTensorBackend:
    """FSDP2 (x tensor parallel) over all ranks of the default process group, on a (dp, tp) mesh.

    Data is split over "dp" only: the tp ranks of one dp group run the same micro-batches.
    """

    backend_kind = TrainingBackend.DTENSOR

    def __init__(self, settings: TrainerSettings, env: DistEnv):
        torch.manual_seed(settings.seed)
        self._env = env
        self._packing = settings.sequence_packing
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        cfg = settings.dtensor_cfg
        check_context_parallel(cfg.context_parallel_size, env.device)
        self._lora = cfg.lora_cfg if cfg.lora_cfg.enabled else None
        self._model_name = settings.model_name
        self._direct_io = settings.checkpoint_direct_io
        self._dims = ParallelDims(env.world_size, cfg.tensor_parallel_size, cfg.sequence_parallel)
        mesh = self._dims.build_mesh(env.device.type)
        self._dp_rank, self._dp_group = mesh.get_local_rank(MeshAxis.DP), mesh.get_group(MeshAxis.DP)
        policy = load_sharded_policy(settings.model_name, env=env, mesh=mesh, dims=self._dims,
                                     compute_dtype=getattr(torch, settings.dtype),
                                     activation_checkpointing=cfg.activation_checkpointing,
                                     offload_policy=offload_policy(cfg.cpu_offload, env.device),
                                     head=settings.model_head, lora_cfg=self._lora,
                                     seed=settings.seed, custom_plan=(resolve_parallel_plan(cfg.custom_parallel_plan)
                                                                      if cfg.custom_parallel_plan else None))
        self._model = policy.model
        self.dropout_free = dropout_free(self._model)
        """No dropout is active in training: the first optimizer step's previous logprobs are its own (losses)."""
        self._pad_id = policy.pad_id
        self.completion_logits_only = self._dims.tp == 1
        """Logits only from the first completion position on (`_first_logit_column`). With tensor
        parallel the full logits (sequence parallel shards the positions the head sees)."""
        self.vocab_size = policy.vocab_size
        self.num_parameters = policy.num_parameters
        self.hf_tensor_shapes = policy.hf_tensor_shapes
        self.checkpoint_dtype = policy.checkpoint_dtype
        if self._lora is not None and self._lora.weight_sync is LoraWeightSync.ADAPTER:
            self.published_tensor_shapes = lora.adapter_shapes(self._model)
            self._iter_published = lambda: lora.iter_adapters(self._model, self.rank, self.held_bytes)
        else:
            self.published_tensor_shapes = self.hf_tensor_shapes
            self._iter_published = self.iter_hf_tensors
        opt = settings.optimizer
        self._params = [p for p in self._model.parameters() if p.requires_grad]
        # fused: one kernel per parameter, no temporaries. torch picks foreach for CUDA tensors and a
        # per-parameter loop on CPU. On the embedded model's 39 ms SFT step the loop cost 7.1 ms
        # (one DTensor op per parameter and update term) and foreach 3.3 ms; at Qwen2.5-0.5B's shape
        # foreach allocates model-sized temporaries and took 4-9x fused's time (benchmarks/optimizer_step.py,
        # benchmarks/train_step_real_size.py). Same update within fp32 rounding.
        self._optimizer = torch.optim.AdamW(self._params, lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                            weight_decay=opt.weight_decay, fused=True)
        self._max_grad_norm = settings.max_grad_norm or math.inf
        self._reference = ReferenceWeights(self._params, local_value, before_swap=self._unchanged_until_written)
        self._write = checkpoint.PendingWrite.finished()  # a save's bytes on their way to disk (checkpoint.py)
        self._saved: tuple[Path, int] | None = None  # the last save's directory and step
        self._optimizer.register_step_pre_hook(self._unchanged_until_written)
        self.held_bytes = HeldBytes()
        self.global_step = 0

    # ------------------------------------------------------------------ logprobs

    def compute_logprobs(self, samples: Sequence[Sample], policy: Policy,
                         micro_batch_size: int) -> list[list[float]] | None:
        with self._reference.holding(policy):
            return self._per_completion(samples, micro_batch_size, self._score)

    def compute_values(self, samples: Sequence[Sample], micro_batch_size: int) -> list[list[float]] | None:
        """A critic's values of the completion tokens' states, aligned as `compute_logprobs`'s rows."""
        self._model.eval()
        with torch.no_grad():
            return self._per_completion(samples, micro_batch_size, self._values)

    def _per_completion(self, samples: Sequence[Sample], micro_batch_size: int,
                        forward: Callable[[MicroBatch], torch.Tensor]) -> list[list[float]] | None:
        """`forward`'s [B, T-1] rows at each sample's completion positions, in sample order, on rank
        0 (None elsewhere): this rank's micro-batches, then a gather over the ranks."""
        split = self._splitter(micro_batch_size, self._packing.logprob_mb_tokens)
        shard, groups = rank_micro_batches(samples, self._dp_rank, self._dims.dp, split)
        results: list[list[float] | None] = [None] * len(shard)
        for group in groups:  # an empty group is a throwaway forward (every rank runs as many)
            batch = self._collate([shard[i] for i in group])
            rows = completion_logprobs(forward(batch), batch)
            for i, row in zip(group, rows):
                results[i] = row
        gathered: list | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(results, gathered, dst=0, group=self._env.cpu_group)
        if gathered is None:
            return None
        return [row for part in gathered[::self._dims.tp] for row in part]  # one tp rank per dp shard

    def _values(self, batch: MicroBatch) -> torch.Tensor:
        """[B, T-1] float32: column j the value model's output at position j (the state of tokens
        0..j, from which token j+1 is sampled), the layout of the logprobs (never packed)."""
        return self._run_model(batch.input_ids, None)[:, :-1, 0].float()

    def _splitter(self, micro_batch_size: int, packing_tokens: int) -> Callable[[Sequence[Sample]], list[list[int]]]:
        """Micro-batches of a shard as index lists: by count, or by token budget when packing."""
        if self._packing.enabled:
            algorithm = self._packing.algorithm
            return lambda shard: pack_bins([len(s.token_ids) for s in shard], packing_tokens, algorithm)
        return lambda shard: [list(range(i, min(i + micro_batch_size, len(shard))))
                              for i in range(0, len(shard), micro_batch_size)]

    def _collate(self, chunk: Sequence[Sample]) -> MicroBatch:
        """The micro-batch of `chunk`; an empty chunk is a one-token filler with nothing to train."""
        chunk = chunk or [Sample((self._pad_id, self._pad_id), 1, loss_mask=(0.0,))]
        return (pack if self._packing.enabled else collate)(chunk, self._pad_id, self.device)

    def _forward(self, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits as the model ran, [B, T-1] logprobs in the padded layout, the mask matching the logits).
        Unpacked, the logits start at column `start` (`_first_logit_column`): the logprobs left of
        it are 0, and nothing reads them (they are prompt columns, masked out)."""
        packed = batch.packed
        if packed is None:
            start = self._first_logit_column(batch)
            logits = self._run_model(batch.input_ids, None, keep_from=start)
            logprobs = token_logprobs(logits, batch.input_ids[:, start:])
            return logits, torch.nn.functional.pad(logprobs, (start, 0)), batch.mask[:, start:]
        logits = self._run_model(packed.input_ids, packed.position_ids)
        return logits, unpack_logprobs(token_logprobs(logits, packed.input_ids), packed), packed.mask

    def _first_logit_column(self, batch: MicroBatch) -> int:
        """The first position whose logits a loss or a logprob reads: the one predicting the
        earliest first completion token (column P - 1 of the shortest prompt P). The prompt
        positions before it cost the LM head and a log-softmax over the whole vocabulary each
        (at Qwen2.5-0.5B's 151,936 words, a quarter of the forward's FLOPs on short
        completions) and are never read; HF's `logits_to_keep` skips them, as TRL does."""
        return min(batch.prompt_lengths) - 1 if self.completion_logits_only else 0

    def _run_model(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                   keep_from: int = 0) -> torch.Tensor:
        """Logits [B, T - keep_from, V] of positions keep_from..T-1. Sequence parallel shards T
        over tp ranks, so T is padded to a multiple of tp (pad tokens at the end, seen by no real
        token) and the logits cut back. use_cache=False also lets HF read packed samples from
        the position ids."""
        width = input_ids.shape[1]
        extra = -width % self._dims.tp if self._dims.sequence_parallel else 0
        if extra:
            input_ids = torch.nn.functional.pad(input_ids, (0, extra), value=self._pad_id)
            if position_ids is not None:
                tail = position_ids[:, -1:] + torch.arange(1, extra + 1, device=position_ids.device)
                position_ids = torch.cat([position_ids, tail], dim=1)
        total = input_ids.shape[1]
        keep = {"logits_to_keep": total - keep_from} if keep_from else {}
        logits = self._model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **keep).logits
        if isinstance(logits, DTensor):  # a custom plan may leave the head's output sharded over the vocabulary
            logits = logits.full_tensor()
        if logits.shape[1] == total:  # all positions (keep_from 0, or a model without logits_to_keep)
            logits = logits[:, keep_from:]
        return logits[:, :width - keep_from]

    @torch.no_grad()
    def _score(self, batch: MicroBatch) -> torch.Tensor:
        self._model.eval()
        return self._forward(batch)[1]

    # ------------------------------------------------------------------ training

    def train_step(self, samples: Sequence[Sample], loss: LossConfig, global_batch_size: int,
                   micro_batch_size: int, learning_rate: float | None) -> StepResult:
        with self._learning_rate(learning_rate):
            return self._train_step(samples, loss, global_batch_size, micro_batch_size)

    @contextmanager
    def _learning_rate(self, learning_rate: float | None) -> Iterator[None]:
        groups = self._optimizer.param_groups
        configured = [g["lr"] for g in groups]
        if learning_rate is not None:
            for g in groups:
                g["lr"] = learning_rate
        try:
            yield
        finally:
            for g, lr in zip(groups, configured):
                g["lr"] = lr

    def _train_step(self, samples: Sequence[Sample], loss: LossConfig, global_batch_size: int,
                    micro_batch_size: int) -> StepResult:
        loss_fn = build_loss_fn(loss)
        steps = optimizer_steps(samples, global_batch_size)
        split = self._splitter(micro_batch_size, self._packing.train_mb_tokens)
        local = []
        for step in steps:
            shard, groups = rank_micro_batches(step, self._dp_rank, self._dims.dp, split)
            local.append([self._collate([shard[i] for i in group]) for group in groups])
        prev = [[self._score(b) for b in step] if previous_logprobs_needed(loss_fn, s, self.dropout_free) else None
                for s, step in enumerate(local)]
        ref = None
        if loss_fn.needs_reference_logprobs:
            with self._reference.holding("reference"):
                ref = [[self._score(b) for b in step] for step in local]
        per_step = [self._optimizer_step(batches, loss_fn, count_loss_tokens(step),
                                         prev[s], ref[s] if ref else None,
                                         num_sequences=count_loss_sequences(step))
                    for s, (step, batches) in enumerate(zip(steps, local))]
        metrics = {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
        metrics["num_tokens"] = float(sum(m["num_tokens"] for m in per_step))
        return StepResult(metrics, self.global_step)

    def _optimizer_step(self, batches: list[MicroBatch], loss_fn: LossFn, num_tokens: int,
                        prev: list[torch.Tensor] | None, ref: list[torch.Tensor] | None, *,
                        num_sequences: int | None = None) -> dict[str, float]:
        self._model.train()
        self._optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(batches):
            scalar_head = loss_fn.takes_sequence_scores or loss_fn.takes_token_values
            if loss_fn.takes_sequence_scores:
                # a reward model's logits are [B, 1]: its score at each row's last real token (never packed)
                logits = self._run_model(batch.input_ids, None)
                curr = logits[:, 0].float()
            elif loss_fn.takes_token_values:  # a critic: [B, T-1] values (never packed)
                logits = curr = self._values(batch)
            else:
                logits, curr, logits_mask = self._forward(batch)
            inputs = LossInputs(batch.mask, batch.advantages, prev[i] if prev else None,
                                batch.generation_logprobs, ref[i] if ref else None, batch.teacher_logprobs,
                                batch.returns, batch.old_values)
            out = loss_fn(curr, inputs, num_tokens, num_sequences)
            out.loss.backward()
            step_metrics = dict(out.metrics)
            if not scalar_head:
                step_metrics["entropy"] = masked_entropy_sum(logits[:, :-1], logits_mask) / max(num_tokens, 1)
            for name, value in step_metrics.items():
                sums[name] = sums.get(name, 0.0) + value.detach().float()
            del logits, curr, out
        grad_norm = clip_grad_norm(self._params, self._max_grad_norm)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)  # applied: free them (a model's size) until the next backward
        self.global_step += 1
        names = sorted(sums)
        totals = torch.stack([sums[n] for n in names]).to(self.device)
        dist.all_reduce(totals, group=self._dp_group)  # globally normalised: the sum over dp ranks is the mean
        metrics = dict(zip(names, totals.tolist()))
        metrics.update(grad_norm=float(grad_norm), lr=float(self._optimizer.param_groups[0]["lr"]),
                       num_tokens=float(num_tokens))
        return metrics

    # ------------------------------------------------------------------ state

    def iter_hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective generator: every rank all-gathers one parameter at a time (`full_tensor()`),
        in `hf_tensor_shapes` order (the bucket plan's); rank 0 yields it (on this rank's
        device), the others yield nothing but must exhaust it. `held_bytes` counts what rank 0 holds.
        With LoRA the tensors are the merged ones (lora.iter_merged)."""
        if self._lora is not None:
            yield from lora.iter_merged(self._model, list(self.hf_tensor_shapes), self._lora.scaling, self.rank,
                                        self.held_bytes)
            return
        state = self._model.state_dict()
        for name in self.hf_tensor_shapes:
            value = state[name]
            if not isinstance(value, DTensor):
                if self.rank == 0:
                    yield name, value.detach()
                continue
            full = value.full_tensor()
            if self.rank == 0:
                yield name, self.held_bytes.track(full)
            del full  # freed before the next parameter is gathered

    def iter_published_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective generator of what a publish carries: `iter_hf_tensors`, or with LoRA's
        `weight_sync: adapter` the adapters alone (lora.iter_adapters)."""
        return self._iter_published()

    def keep_published_in(self, plan: BucketPlan) -> bool:
        """On one rank without LoRA the parameters are plain tensors and published as they are: each
        moves into its view of one block laid out as `plan`, when every one is in the plan's dtype
        (the generators'), so a publish sends the block bucket by bucket, no copy. The optimizer
        and the reference keep the same Parameter objects; loads and swaps copy into them in place."""
        if self._lora is not None:
            return False
        params = dict(self._model.named_parameters())  # a tied head is its embedding's Parameter
        chosen = [params.get(spec.name) for spec in plan.tensors]
        if any(p is None or isinstance(p, DTensor) or p.dtype != getattr(torch, spec.dtype)
               or tuple(p.shape) != spec.shape for p, spec in zip(chosen, plan.tensors)):
            return False
        _, views = plan_block_views(plan, self.device)
        with torch.no_grad():
            for param, spec in zip(chosen, plan.tensors):
                views[spec.name].copy_(param)
                param.data = views[spec.name]
        return True

    def gather_hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        if self._lora is not None:
            merged = {name: tensor.cpu() for name, tensor in self.iter_hf_tensors()}
            return merged if self.rank == 0 else None
        full = get_model_state_dict(self._model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return {name: self.held_bytes.track(full[name]) for name in self.hf_tensor_shapes}

    def save_checkpoint(self, path: Path, *, background: bool = False) -> None:
        self._write.join()  # the previous save's bytes first (see _previous_write_ended)
        self._write = checkpoint.start_save(path, self._model, self._optimizer, rank=self.rank,
                                            trained_only=self._lora is not None, background=background,
                                            direct=self._direct_io)
        self._saved = (path, self.global_step)
        if not background:
            dist.barrier(group=self._env.cpu_group)  # every rank's bytes are on disk
            if self.rank == 0:
                self.checkpoint_written(path, timeout_s=60.0)

    def checkpoint_written(self, path: Path, timeout_s: float) -> bool:
        """Rank 0, beside the commands (no collective): wait up to timeout_s for the save into
        `path` to be on disk on every rank, then mark it complete; False if still writing."""
        if self._saved is None or self._saved[0] != path:
            return checkpoint.is_checkpoint(path)
        deadline = time.monotonic() + timeout_s
        if not self._write.wait(timeout_s):
            return False
        checkpoint.finish_save(path, world_size=self.world_size, global_step=self._saved[1],
                               timeout_s=max(deadline - time.monotonic(), 1.0))
        return True

    # _previous_write_ended: a save or load waits for the previous background write to end, and
    # never raises its error. The error is that checkpoint's (its rank's `written` marker never
    # appears, so it is never complete: checkpoint_written reports it on rank 0); raised here it
    # stopped one rank before the collectives that the other ranks entered, and the trainer hung
    # (benchmarks/chaos.py's full disk: rank 0's write failed while rank 1's save had failed the
    # call, so nothing asked rank 0 for its error until the next save).

    def _unchanged_until_written(self, *_: object) -> None:
        """Before the parameters or Adam's state change: a background save still reading them
        finishes (its error, if any, is the save's to report: `checkpoint_written`, the next save)."""
        self._write.join()

    def load_checkpoint(self, path: Path) -> int:
        if not checkpoint.is_checkpoint(path):  # every rank raises before any collective
            raise ValueError(f"no trainer checkpoint at {path}")
        self._write.join()  # (see _previous_write_ended)
        self.global_step = checkpoint.load_checkpoint(path, self._model, self._optimizer, rank=self.rank,
                                                      trained_only=self._lora is not None, direct=self._direct_io)
        return self.global_step

    def export_adapter(self, path: Path) -> int:
        """Collective: with LoRA, the adapters in PEFT's layout into `path` (rank 0); else nothing."""
        if self._lora is None:
            return 0
        return lora.export_adapter(self._model, self._lora, self._model_name, path, self.rank)

    def close(self) -> None:
        self._write.join()  # a checkpoint still being written ends first (the process may exit next)
        self._optimizer.zero_grad(set_to_none=True)
        self._reference.clear()


def check_context_parallel(size: int, device: torch.device) -> None:
    """dtensor_cfg.context_parallel_size > 1 (see the key's doc): refused with what is missing."""
    if size == 1:
        return
    if device.type != "cuda":
        raise ValueError(f"dtensor_cfg.context_parallel_size={size} needs CUDA: torch's context_parallel shards "
                         "only the CUDA SDPA kernels (flash / memory-efficient / cuDNN ring attention), and this "
                         "trainer runs on CPU, where torch's attention has no ring kernel; set it to 1 (or use "
                         "megatron_cfg.context_parallel_size on GPUs)")
    raise ValueError(f"dtensor_cfg.context_parallel_size={size}: the DTensor backend does not run torch's "
                     "context_parallel yet (its ring attention must enclose forward and backward of every micro-batch, "
                     "and the FSDP mesh must span dp x cp); set it to 1, or use megatron_cfg.context_parallel_size "
                     "(Megatron with Transformer Engine's ring attention)")
