"""The routers' load-balancing loss in Tandem's loss normalisation, and its metric.

Megatron adds the auxiliary loss through its own backward hook (MoEAuxLossAutoScaler): with
`calculate_per_token_loss` each micro-batch contributes `coeff * aux * n` (n: the tokens the
router saw on this rank), expecting `finalize_model_grads` to divide every gradient by the
step's token count. Tandem's losses are already globally normalised, so its finalize divides
nothing (backend._finalize_summed); instead the coefficient Megatron reads is set, before each
optimizer step, to `coeff / (n * micro-batches * data-parallel ranks)`: the gradient is then
`coeff` times the mean of the micro-batches' aux losses, whatever the layout. Megatron's
tracker logs `aux / coefficient`, the raw loss, whatever coefficient it was given.

The metric (`moe_load_balancing_loss` for aux_loss, `moe_seq_load_balancing_loss`,
`moe_global_load_balancing_loss`) is the mean over layers, micro-batches and data-parallel
ranks of the raw loss of each training forward; `moe_per_layer_logging` adds one per layer.
"""

from __future__ import annotations

from trainer_svc.backends.megatron.moe import MoeArch
from trainer_svc.config.megatron import MegatronSettings

_TRACKED = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
            "global_aux_loss": "global_load_balancing_loss"}


class MoeAuxLoss:
    def __init__(self, config, arch: MoeArch, cfg: MegatronSettings):
        self._config = config
        self._coeff = arch.moe.aux_loss_coeff
        self._name = _TRACKED.get(cfg.moe_router_load_balancing_type)
        self._per_layer = cfg.moe_per_layer_logging
        self._tokens_divisor = cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1

    @property
    def enabled(self) -> bool:
        return self._name is not None and self._coeff > 0

    def prepare(self, micro_batch_size: int, width: int, num_micro: int, dp_size: int) -> None:
        """Scale the coefficient Megatron reads for an optimizer step of `num_micro` micro-batches
        of [micro_batch_size, width] tokens on each of `dp_size` replicas."""
        if self.enabled:
            tokens = micro_batch_size * width // self._tokens_divisor
            self._config.moe_aux_loss_coeff = self._coeff / (tokens * num_micro * dp_size)

    def collect(self, num_micro: int) -> dict[str, float]:
        """Collective (every rank): the step's metrics; clears Megatron's tracker."""
        if not self.enabled:
            return {}
        from megatron.core.transformer.moe import moe_utils

        tracker = moe_utils.get_moe_layer_wise_logging_tracker()
        if self._name not in tracker:
            return {}
        moe_utils.reduce_aux_losses_tracker_across_ranks([self._name])
        per_layer = (tracker[self._name]["values"] / num_micro).tolist()
        moe_utils.clear_aux_losses_tracker()
        metrics = {f"moe_{self._name}": sum(per_layer) / len(per_layer)}
        if self._per_layer:
            metrics.update({f"moe_{self._name}_layer_{i}": v for i, v in enumerate(per_layer)})
        return metrics
