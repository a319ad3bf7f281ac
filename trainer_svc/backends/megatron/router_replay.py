"""MoE router replay (R3) on megatron-core's own RouterReplay
(megatron/core/transformer/moe/router_replay.py, turned on by `moe_enable_routing_replay`):
every MoE router of the model holds one instance, in layer order, and with the action
REPLAY_FORWARD it takes its top-k experts from the instance's target instead of its scores;
the routing probabilities are still the router's own scores gathered at those experts, so the
router keeps its gradient.

Two additions, in a subclass the instances are switched to after the model is built:
- rows whose target is `trainer_svc.routes.NOT_ROUTED` (the last token of a sample, padding)
  take the router's own top-k: a generator never feeds the last sampled token;
- per instance, the rows replayed, those where the router's own top-k differs from the
  replayed one (as sets), and the indices last used (`recorded_indices`, for tests).

Layouts: tensor, expert, data and sequence parallel. Not pipeline parallel (Megatron's 1F1B
runs several forwards before their backwards, which this does not order) nor context parallel
(each rank holds a load-balanced, non-contiguous share of the sequence): refused at start.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer_svc.routes import NOT_ROUTED, router_targets


def _replay_class():
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    class TandemRouterReplay(RouterReplay):
        replayed_rows: int = 0
        changed_rows: int = 0

        def set_target_indices(self, topk_indices: torch.Tensor) -> None:
            self.target_topk_idx = topk_indices  # no backward list: recompute replays the same target

        def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
            if self.router_replay_action is not RouterReplayAction.REPLAY_FORWARD or self.target_topk_idx is None:
                return default_compute_topk(scores, topk, num_groups, group_topk)
            target = self.target_topk_idx.to(scores.device)
            if target.shape != (scores.shape[0], topk):
                raise AssertionError(f"router replay target {tuple(target.shape)} for {scores.shape[0]} tokens x "
                                     f"top-{topk}")
            _, own = default_compute_topk(scores, topk, num_groups, group_topk)
            given = target[:, 0] != NOT_ROUTED
            indices = torch.where(given.unsqueeze(1), target, own)
            with torch.no_grad():
                differs = (indices.sort(dim=1).values != own.sort(dim=1).values).any(dim=1) & given
                self.replayed_rows += int(given.sum())
                self.changed_rows += int(differs.sum())
            self.record_indices(indices.detach())
            return scores.gather(1, indices), indices

    return TandemRouterReplay, RouterReplayAction


def reset_instances() -> None:
    """Forget the routers of an earlier model in this process (Megatron keeps them in a class list)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    RouterReplay.clear_global_router_replay_instances()


class RouterReplayer:
    """The built model's routers (this rank's, in layer order) and the targets they replay."""

    def __init__(self, num_layers: int, *, tp_rank: int, tp_size: int, sequence_parallel: bool):
        from megatron.core.transformer.moe.router_replay import RouterReplay

        cls, self._actions = _replay_class()
        self._instances = list(RouterReplay.global_router_replay_instances)
        if len(self._instances) != num_layers:
            raise AssertionError(f"{len(self._instances)} router replay instances for {num_layers} MoE layers")
        for instance in self._instances:
            instance.__class__ = cls
        self._tp_rank, self._tp_size, self._sp = tp_rank, tp_size, sequence_parallel

    def replay(self, routes_BTLK: torch.Tensor | None) -> None:
        """Route the next forward by `routes_BTLK` ([B, T, layers, k]); None: the routers' own choice."""
        if routes_BTLK is None:
            for instance in self._instances:
                instance.clear_indices()
                instance.clear_router_replay_action()
            return
        targets = router_targets(routes_BTLK, tp_rank=self._tp_rank, tp_size=self._tp_size,
                                 sequence_parallel=self._sp)
        for instance, target in zip(self._instances, targets):
            instance.set_target_indices(target)
            instance.set_router_replay_action(self._actions.REPLAY_FORWARD)

    def take_counts(self) -> tuple[int, int]:
        """(rows replayed, rows whose experts the router alone would have chosen differently) over
        every layer since the last call; resets them."""
        replayed = sum(i.replayed_rows for i in self._instances)
        changed = sum(i.changed_rows for i in self._instances)
        for instance in self._instances:
            instance.replayed_rows = instance.changed_rows = 0
        return replayed, changed

    def recorded_indices(self) -> Sequence[torch.Tensor | None]:
        """Per layer, the [tokens, k] experts the last replayed forward used."""
        return [i.get_recorded_indices() for i in self._instances]


def check_layout(pipeline_parallel: int, context_parallel: int) -> None:
    if pipeline_parallel > 1 or context_parallel > 1:
        raise ValueError("router_replay runs with tensor, expert, data and sequence parallelism only: set "
                         "megatron_cfg.pipeline_model_parallel_size and context_parallel_size to 1 (or "
                         "router_replay.enabled=false)")
