"""MegatronBackend: the `TrainerBackend` contract (see `trainer_svc.interfaces`) on a
megatron-core GPTModel with tensor, pipeline and data parallelism.

Same losses, logprob alignment, metrics and global normalisation as the DTensor backend:
- Every micro-batch of a call is padded to the same rows and width (Megatron's pipeline
  schedules exchange fixed-shape activations); padding rows have an all-zero loss mask.
- The model returns full-vocabulary logits (`parallel_output=False` gathers the TP shards;
  the gather's backward splits the gradient again), so `trainer_svc.losses` applies as is.
- `calculate_per_token_loss` keeps Megatron from rescaling the loss by the number of
  micro-batches, and gradients are SUMMED over data-parallel ranks, while each micro-batch
  loss is already divided by the step's global token count.
- Metrics come from the last pipeline stage's first TP rank of every data-parallel replica.
The reference policy is a copy of the initial weights swapped in (in place) for reference passes.
Mixture-of-experts models (moe.py) add expert parallelism, frozen routers and the routers'
load-balancing loss (moe_train.py); their export gathers experts over EP (moe_weights.py).
With router_replay on, every forward over samples that carry the generator's routes takes
their experts (router_replay.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog
import torch
import torch.distributed as dist

from trainer_svc.backends.megatron import checkpoint, cpu_compat, gpu_features, moe, moe_weights, router_replay
from trainer_svc.backends.megatron.convert import hf_shapes
from trainer_svc.backends.megatron.model import (
    OptimizerDefaults,
    build_gpt_model,
    build_optimizer,
    check_supported,
    compute_dtype,
    destroy_model_parallel,
    freeze_routers,
    init_model_parallel,
    transformer_config,
    wrap_ddp,
)
from trainer_svc.backends.megatron.moe_train import MoeAuxLoss
from trainer_svc.backends.megatron.placement import ModelPlacement
from trainer_svc.backends.megatron.tokens import TokenMath
from trainer_svc.backends.megatron.weights import iter_hf_tensors, load_weights
from trainer_svc.backends.reference import ReferenceWeights
from trainer_svc.batching import (
    MicroBatch,
    collate,
    completion_logprobs,
    count_loss_tokens,
    optimizer_steps,
    rank_shard,
)
from trainer_svc.config import TrainerSettings, TrainingBackend
from trainer_svc.distributed import DistEnv
from trainer_svc.held_bytes import HeldBytes
from trainer_svc.routes import routes_BTLK
from trainer_svc.losses import (
    LossFn,
    LossInputs,
    build_loss_fn,
    count_loss_sequences,
    previous_logprobs_needed,
)
from trainer_svc.types import LossConfig, Policy, Sample, StepResult


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class MegatronBackend:
    """A local-spec GPTModel converted from the HF checkpoint, trained with Megatron's schedules."""

    backend_kind = TrainingBackend.MEGATRON

    def __init__(self, settings: TrainerSettings, env: DistEnv, log=None):
        from transformers import AutoConfig

        self._log = log or structlog.get_logger()
        self._env = env
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        cfg = settings.megatron_cfg
        if not (Path(settings.model_name) / "config.json").is_file():
            raise ValueError(f"model_name {settings.model_name!r} is not an HF checkpoint directory (no config.json)")
        hf_config = AutoConfig.from_pretrained(settings.model_name)
        self.arch = moe.arch_from_hf_config(hf_config)
        on_gpu = env.device.type == "cuda"
        check_supported(cfg, self.arch, env.world_size, on_gpu=on_gpu)
        placement = ModelPlacement.for_device(env.device, sequence_parallel=cfg.sequence_parallel,
                                              use_te=gpu_features.uses_te(cfg, on_gpu))
        placement.prepare()
        torch.manual_seed(settings.seed)
        if moe.is_moe(self.arch):
            gpu_features.patch_router_without_te()
        replay = settings.router_replay.enabled
        if replay:
            if not moe.is_moe(self.arch):
                raise ValueError(f"router_replay needs a mixture-of-experts model; {settings.model_name} is a dense "
                                 f"{self.arch.family}: set router_replay.enabled=false")
            router_replay.check_layout(cfg.pipeline_model_parallel_size, cfg.context_parallel_size)
            router_replay.reset_instances()
        with cpu_compat.active():
            self.layout = init_model_parallel(cfg, settings.seed)
            dtype = compute_dtype(cfg, settings.dtype)
            self._config = transformer_config(self.arch, cfg, dtype, cpu_initialization=placement.cpu_initialization)
            self._config.moe_enable_routing_replay = replay  # megatron-core's RouterReplay in every router
            self._model = placement.place(build_gpt_model(self.arch, self._config, self.layout, use_te=placement.use_te))
            self.conversion, self.conversion_s = load_weights(self._model, self.arch, self.layout, settings.model_name, rank=self.rank,
                                           group=env.cpu_group, log=self._log)
            if cfg.freeze_moe_router:
                freeze_routers(self._model)
            self._ddp = wrap_ddp(self._model, self._config, cfg)
            self._config.no_sync_func = self._ddp.no_sync
            self._config.finalize_model_grads_func = _finalize_summed
            opt = settings.optimizer
            defaults = OptimizerDefaults(opt.lr, opt.weight_decay, opt.betas, opt.eps, settings.max_grad_norm)
            self._optimizer, self._scheduler = build_optimizer(self._ddp, cfg, defaults, dtype)
        self._pad_id = hf_config.pad_token_id if isinstance(hf_config.pad_token_id, int) else 0
        self._tokens = _token_math(self._pad_id, self.arch.vocab_size)  # context parallel: tokens.py
        self._sequence_multiple = (self.layout.tp_size if cfg.sequence_parallel else 1) * self._tokens.width_multiple
        self._params = [p for p in self._model.parameters()]
        self._moe_aux = MoeAuxLoss(self._config, self.arch, cfg) if moe.is_moe(self.arch) else None
        self._replayer = (router_replay.RouterReplayer(self.arch.num_layers, tp_rank=self.layout.tp_rank,
                                                       tp_size=self.layout.tp_size,
                                                       sequence_parallel=cfg.sequence_parallel) if replay else None)
        self._replay_counts_here = replay and (self.layout.tp_rank == 0 or cfg.sequence_parallel)
        self._reference = ReferenceWeights(self._params)
        self.held_bytes = HeldBytes()
        self.vocab_size = self.arch.vocab_size
        self.hf_tensor_shapes = (moe.hf_shapes(self.arch, self.layout.ep_size) if moe.is_moe(self.arch)
                                 else hf_shapes(self.arch))
        self.num_parameters = sum(math.prod(s) for s in self.hf_tensor_shapes.values())
        self.published_tensor_shapes = self.hf_tensor_shapes  # no LoRA here: a publish is the HF tensors
        dtype_name = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
        self.checkpoint_dtype = getattr(torch, dtype_name) if isinstance(dtype_name, str) else dtype_name
        self.global_step = 0

    # ------------------------------------------------------------------ batches

    @property
    def _contributes(self) -> bool:
        """This rank's loss outputs are counted (one rank per data-parallel replica)."""
        return self.layout.is_last_stage and self.layout.tp_rank == 0 and self.layout.cp_rank == 0

    def _micro_batches(self, samples: Sequence[Sample], micro_batch_size: int, num_micro: int,
                       width: int) -> list[MicroBatch]:
        """`num_micro` micro-batches of exactly `micro_batch_size` rows and `width` tokens."""
        filler = Sample((self._pad_id, self._pad_id), 1)
        out = []
        for i in range(num_micro):
            chunk = list(samples[i * micro_batch_size:(i + 1) * micro_batch_size])
            real = len(chunk)
            batch = collate(chunk + [filler] * (micro_batch_size - real), self._pad_id, self.device)
            out.append(_pad(batch, width, real, self._pad_id))
        return out

    def _micro_routes(self, samples: Sequence[Sample], micro_batch_size: int, num_micro: int,
                      width: int) -> list[torch.Tensor | None] | None:
        """Per micro-batch of `_micro_batches`, the [B, width, layers, k] routes to replay (None: the
        routers' own); None when router replay is off."""
        if self._replayer is None:
            return None
        m, filler = self.arch.moe, Sample((self._pad_id, self._pad_id), 1)
        out = []
        for i in range(num_micro):
            chunk = list(samples[i * micro_batch_size:(i + 1) * micro_batch_size])
            out.append(routes_BTLK(chunk + [filler] * (micro_batch_size - len(chunk)), width, self.arch.num_layers,
                                   m.topk, m.num_experts))
        return out

    def _width(self, samples: Sequence[Sample]) -> int:
        width = max(len(s.token_ids) for s in samples)
        return _ceil_div(width, self._sequence_multiple) * self._sequence_multiple

    def _schedule(self, batches: list[MicroBatch], loss_func, *, forward_only: bool,
                  routes: list[torch.Tensor | None] | None = None) -> list:
        """Run Megatron's forward(-backward) schedule over `batches`; the last stage gets the loss
        outputs. With router replay on, micro-batch i's forward replays routes[i] (None: the routers' own)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        feed = iter(zip(batches, routes or [None] * len(batches)))

        def forward_step(data_iterator, model):
            batch, route = next(data_iterator)
            if self._replayer is not None:
                self._replayer.replay(route)
            ids, positions = self._tokens.inputs(batch.input_ids)
            return model(ids, positions, None), partial(loss_func, batch)

        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=feed, model=[self._ddp], num_microbatches=len(batches),
            seq_length=batches[0].input_ids.shape[1], micro_batch_size=batches[0].input_ids.shape[0],
            forward_only=forward_only)

    def _logits(self, output: torch.Tensor) -> torch.Tensor:
        return self._tokens.logits(output)

    # ------------------------------------------------------------------ logprobs

    def _score_batches(self, batches: list[MicroBatch],
                       routes: list[torch.Tensor | None] | None = None) -> list[torch.Tensor | None]:
        """[B, T-1] logprobs per micro-batch on the last stage (None elsewhere)."""
        def loss_func(batch, output):
            logp = self._tokens.logprobs(output, batch.input_ids)
            return output.sum() * 0.0, torch.tensor(1), {"logprobs": logp.detach()}

        self._model.eval()
        with torch.no_grad():
            out = self._schedule(batches, loss_func, forward_only=True, routes=routes)
        self._model.train()
        return [o["logprobs"] for o in out] if self.layout.is_last_stage else [None] * len(batches)

    def compute_values(self, samples: Sequence[Sample], micro_batch_size: int) -> list[list[float]] | None:
        """Not here: a PPO critic (value_model_cfg.enabled) runs on the DTensor backend (refused at load)."""
        raise ValueError("the Megatron backend holds no value model: a PPO critic trains on the DTensor backend")

    def compute_logprobs(self, samples: Sequence[Sample], policy: Policy,
                         micro_batch_size: int) -> list[list[float]] | None:
        with cpu_compat.active():
            dp, dp_rank = self.layout.dp_size, self.layout.dp_rank
            shard = rank_shard(samples, dp_rank, dp)
            num_micro = _ceil_div(_ceil_div(len(samples), dp), micro_batch_size)
            width = self._width(samples)
            batches = self._micro_batches(shard, micro_batch_size, num_micro, width)
            routes = self._micro_routes(shard, micro_batch_size, num_micro, width)
            with self._reference.holding(policy):
                scored = self._score_batches(batches, routes)
            results: list[list[float]] = []
            if self._contributes:
                for batch, logp in zip(batches, scored):
                    results.extend(completion_logprobs(logp, batch))  # the real rows only (see _pad)
            gathered: list | None = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object((dp_rank, self._contributes, results), gathered, dst=0, group=self._env.cpu_group)
        if gathered is None:
            return None
        parts = sorted((d, r) for d, source, r in gathered if source)
        return [row for _, part in parts for row in part]

    # ------------------------------------------------------------------ generation

    def last_token_logits(self, rows: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """Collective: [len(rows), vocab] float32 logits of the token after each row (right-padded
        into one micro-batch) on rank 0, None elsewhere (`trainer_svc.decode`'s model).

        Every data-parallel replica computes all rows (generation is not split over replicas);
        the last pipeline stage of rank 0's replica sends them to rank 0."""
        from megatron.core import parallel_state as ps

        with cpu_compat.active():
            width = _ceil_div(max(len(r) for r in rows), self._sequence_multiple) * self._sequence_multiple
            ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long, device=self.device)
            for i, row in enumerate(rows):
                ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            last = torch.tensor([len(r) - 1 for r in rows], device=self.device)

            def loss_func(batch, output):
                logits = self._logits(output)[torch.arange(len(rows), device=self.device), last]
                return output.sum() * 0.0, torch.tensor(1), {"logits": logits.detach()}

            self._model.eval()
            with torch.no_grad():
                out = self._schedule([_Rows(ids)], loss_func, forward_only=True)
            self._model.train()
            source = ps.get_pipeline_model_parallel_last_rank() if self.rank == 0 else None
            if self.rank == 0:
                if source == 0:
                    return out[0]["logits"]
                logits = torch.empty(len(rows), self.vocab_size, dtype=torch.float32, device=self.device)
                dist.recv(logits, src=source)
                return logits
            if self.layout.is_last_stage and ps.get_pipeline_model_parallel_first_rank() == 0:
                dist.send(out[0]["logits"].contiguous(), dst=0)
        return None

    # ------------------------------------------------------------------ training

    def train_step(self, samples: Sequence[Sample], loss: LossConfig, global_batch_size: int,
                   micro_batch_size: int, learning_rate: float | None) -> StepResult:
        with cpu_compat.active():
            loss_fn = build_loss_fn(loss)
            dp, dp_rank = self.layout.dp_size, self.layout.dp_rank
            width = self._width(samples)
            steps = optimizer_steps(samples, global_batch_size)
            num_micro = _ceil_div(_ceil_div(global_batch_size, dp), micro_batch_size)
            shards = [rank_shard(step, dp_rank, dp) for step in steps]
            local = [self._micro_batches(shard, micro_batch_size, num_micro, width) for shard in shards]
            routes = [self._micro_routes(shard, micro_batch_size, num_micro, width) for shard in shards]
            prev = [self._score_batches(b, routes[s]) if previous_logprobs_needed(loss_fn, s, dropout_free=True)
                    else None for s, b in enumerate(local)]  # dropout-free: hidden_dropout = attention_dropout = 0
            ref = None
            if loss_fn.needs_reference_logprobs:
                with self._reference.holding("reference"):
                    ref = [self._score_batches(b, routes[s]) for s, b in enumerate(local)]
            per_step = [self._optimizer_step(batches, loss_fn, count_loss_tokens(step), count_loss_sequences(step),
                                             prev[s], ref[s] if ref else None, learning_rate, routes[s])
                        for s, (step, batches) in enumerate(zip(steps, local))]
        metrics = {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
        metrics["num_tokens"] = float(sum(m["num_tokens"] for m in per_step))
        return StepResult(metrics, self.global_step)

    def _optimizer_step(self, batches: list[MicroBatch], loss_fn: LossFn, num_tokens: int, num_sequences: int,
                        prev: list | None, ref: list | None, learning_rate: float | None,
                        routes: list[torch.Tensor | None] | None = None) -> dict[str, float]:
        index = {id(b): i for i, b in enumerate(batches)}

        def loss_func(batch, output):
            i = index[id(batch)]
            curr = self._tokens.logprobs(output, batch.input_ids)
            inputs = LossInputs(batch.mask, batch.advantages, prev[i] if prev else None, batch.generation_logprobs,
                                ref[i] if ref else None, batch.teacher_logprobs)
            out = loss_fn(curr, inputs, num_tokens, num_sequences)
            metrics = {**{k: v.detach().float() for k, v in out.metrics.items()},
                       "entropy": self._tokens.entropy_sum(output, batch.mask) / max(num_tokens, 1)}
            return out.loss * self._tokens.loss_scale, torch.tensor(1), metrics  # CP: every CP rank has the whole loss

        self._model.train()
        self._ddp.zero_grad_buffer()
        self._optimizer.zero_grad()
        if self._moe_aux is not None:
            self._moe_aux.prepare(*batches[0].input_ids.shape, len(batches), self.layout.dp_size)
        if self._replayer is not None:
            self._replayer.take_counts()  # the scoring passes' counts are not this step's training forward's
        outputs = self._schedule(batches, loss_func, forward_only=False, routes=routes)
        if learning_rate is not None:
            for group in self._optimizer.param_groups:
                group["lr"] = learning_rate
        lr = float(self._optimizer.param_groups[0]["lr"])
        _, grad_norm, _ = self._optimizer.step()
        self._scheduler.step(increment=1)
        self.global_step += 1
        sums: dict[str, float] = {}
        if self._contributes:
            for out in outputs:
                for name, value in out.items():
                    sums[name] = sums.get(name, 0.0) + float(value)
        if self._replayer is not None:
            replayed, changed = self._replayer.take_counts()
            if self._replay_counts_here:  # each token's rows counted once over TP (sequence parallel: split)
                sums.update(_replayed_rows=float(replayed), _changed_rows=float(changed))
        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, sums, group=self._env.cpu_group)
        metrics: dict[str, float] = {}
        for part in parts:
            for name, value in part.items():
                metrics[name] = metrics.get(name, 0.0) + value
        metrics.update(grad_norm=float(grad_norm or 0.0), lr=lr, num_tokens=float(num_tokens))
        if self._replayer is not None:
            replayed, changed = metrics.pop("_replayed_rows", 0.0), metrics.pop("_changed_rows", 0.0)
            metrics.update(moe_router_replay_rows=replayed,
                           moe_router_replay_disagreement=changed / replayed if replayed else 0.0)
        if self._moe_aux is not None:
            metrics.update(self._moe_aux.collect(len(batches)))
        return metrics

    # ------------------------------------------------------------------ state

    def iter_published_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a publish carries: the HF tensors (no LoRA on this backend)."""
        return self.iter_hf_tensors()

    def keep_published_in(self, plan) -> bool:
        """Never: the HF tensors are converted from Megatron's layout (fused QKV, ...) as published."""
        return False

    def iter_hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective generator of full HF tensors on rank 0, in `hf_tensor_shapes` order
        (see `weights.iter_hf_tensors`); `held_bytes` counts what rank 0 holds meanwhile."""
        from megatron.core import parallel_state as ps

        # no cpu_compat.active() here: the export makes no CUDA tensors, and a mode entered in a
        # generator would stay pushed while the consumer (the weight sender) runs between items
        exports = self.layout.dp_rank == 0 and ps.get_context_parallel_rank() == 0
        if moe.is_moe(self.arch):
            yield from moe_weights.iter_moe_hf_tensors(self._model, self.arch, self.layout,
                                                       groups=moe_weights.process_groups(), dense_exports=exports,
                                                       rank=self.rank, held=self.held_bytes)
            return
        stage_ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
        yield from iter_hf_tensors(self._model, self.arch, self.layout, tp_group=ps.get_tensor_model_parallel_group(),
                                   stage_ranks=stage_ranks, exports=exports, rank=self.rank, held=self.held_bytes)

    def gather_hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        state = {name: self.held_bytes.track(tensor.cpu()) for name, tensor in self.iter_hf_tensors()}
        return state if self.rank == 0 else None

    def save_checkpoint(self, path: Path, *, background: bool = False) -> None:
        """Synchronous either way (Megatron's own format): complete when it returns."""
        with cpu_compat.active():
            checkpoint.save_checkpoint(path, self._ddp, self._optimizer, self._scheduler, rank=self.rank,
                                       world_size=self.world_size, global_step=self.global_step)
        dist.barrier(group=self._env.cpu_group)

    def checkpoint_written(self, path: Path, timeout_s: float) -> bool:
        return checkpoint.is_checkpoint(path)

    def load_checkpoint(self, path: Path) -> int:
        if not checkpoint.is_checkpoint(path):
            raise ValueError(f"no trainer checkpoint at {path}")
        with cpu_compat.active():
            self.global_step = checkpoint.load_checkpoint(path, self._ddp, self._optimizer, self._scheduler,
                                                          rank=self.rank)
        return self.global_step

    def export_adapter(self, path: Path) -> int:
        """This backend trains no LoRA adapters (megatron_cfg has no lora_cfg): writes nothing."""
        return 0

    def close(self) -> None:
        self._reference.clear()
        destroy_model_parallel()


def _token_math(pad_id: int, vocab_size: int) -> TokenMath:
    from megatron.core import parallel_state as ps

    return TokenMath(ps.get_context_parallel_world_size(), ps.get_context_parallel_rank(),
                     ps.get_context_parallel_group(), pad_id, vocab_size)


def _finalize_summed(model, num_tokens=None, *args, **kwargs):
    """Megatron's finalize without the per-token rescale: the losses are already globally normalised."""
    from megatron.core.distributed import finalize_model_grads

    return finalize_model_grads(model, None, *args, **kwargs)


@dataclass(frozen=True)
class _Rows:
    """A micro-batch of token rows only (what `_schedule`'s forward step reads)."""

    input_ids: torch.Tensor


def _pad(batch: MicroBatch, width: int, real_rows: int, pad_id: int) -> MicroBatch:
    """Widen to `width` tokens and zero the loss mask of the filler rows past `real_rows`."""
    extra = width - batch.input_ids.shape[1]
    pad2 = (0, extra)
    mask = torch.nn.functional.pad(batch.mask, pad2)
    mask[real_rows:] = 0.0
    return MicroBatch(torch.nn.functional.pad(batch.input_ids, pad2, value=pad_id), mask,
                      torch.nn.functional.pad(batch.advantages, pad2),
                      torch.nn.functional.pad(batch.generation_logprobs, pad2),
                      batch.prompt_lengths[:real_rows], batch.lengths[:real_rows],
                      teacher_logprobs=None if batch.teacher_logprobs is None
                      else torch.nn.functional.pad(batch.teacher_logprobs, pad2))
