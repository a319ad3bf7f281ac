"""Weight loading inside vLLM's worker process (the class passed as `worker_extension_cls`).

vLLM mixes this class into its worker, so its methods run where the model lives and are
reached with `collective_rpc(name, args=...)` (STAGE, APPLY below). In vLLM's default
multi-process mode collective_rpc pickles its arguments between processes and cannot carry
tensors, so the weight source arrives as JSON (tandem.weight_source) and the bytes come from
the source itself: the weight-sync collective, shared-memory files or CUDA IPC handles.

With several workers (vLLM tensor/pipeline parallel), the collective source is read by the
first worker alone and fanned out to the others over vLLM's device group (NCCL on GPUs, gloo
on CPU: generator_svc/fanout.py); shared-memory and
CUDA IPC sources are read by every worker itself.

Also RELEASE: free the weights while the trainer trains (CPU, generator_svc/free_weights.py),
and CAPTURE_ROUTES / TAKE_ROUTES: the experts vLLM-CPU's routers chose for each request's tokens
(MoE router replay, generator_svc/route_capture.py).

With LoRA adapters as the published version (GeneratorSettings.lora_adapters), WRITE_ADAPTER
replaces APPLY: the staged adapter is written as a PEFT directory (generator_svc/lora_adapter.py)
that the engine then hands to vLLM's LoRA manager; the base weights are never touched.

Two steps, so that a failed read never touches the model:
1. STAGE reads a whole version into memory (generator_svc/staging.py), or raises, staging nothing;
2. APPLY loads it with `model_runner.reload_weights`, which restores the layer layout, loads
   HF-named checkpoint tensors and re-packs the CPU kernels' weights (plain
   `model.load_weights` fails on CPU once the linear weights are packed); then a tied output
   head, which that reload skips, is re-packed from the new embedding (tied_weights.py).

Or, streamed (RECEIVE_APPLY: one worker, a collective source, generation drained): the reload
takes each checksum window's buckets as soon as they arrived and passed their checksums while
the next window arrives, so receive and apply overlap and about two windows are held instead
of the whole version. The first window is received and checked before the model is touched: a
transfer that fails then
leaves the old version serving; one that fails later leaves weights of no version, which the
engine stops serving (generator_svc/engines/vllm_engine.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from generator_svc.fanout import fan_out
from generator_svc.free_weights import free_weights, freeable_methods, still_freed
from generator_svc.lora_adapter import write_adapter
from generator_svc.moe_repack import repack_moe_experts
from generator_svc.receive_threads import threads_while_receiving
from generator_svc.reload_log import quiet_unloaded_by_design
from generator_svc.route_capture import RouteCapture
from generator_svc.staging import Stager
from generator_svc.tied_weights import refresh_tied_layers, unquantized_embedding_methods
from tandem.host_memory import release_free_memory
from tandem.weight_source import CollectiveSource, source_from_json

STAGE = "tandem_stage"
APPLY = "tandem_apply_staged"
RECEIVE_APPLY = "tandem_receive_apply"
PREPARE_PIPELINE = "tandem_prepare_pipeline"
RELEASE = "tandem_free_weights"
CAPTURE_ROUTES = "tandem_capture_routes"
TAKE_ROUTES = "tandem_take_routes"
WRITE_ADAPTER = "tandem_write_adapter"


class TandemWeightExtension:
    """Mixed into vLLM's worker; attribute names carry a `tandem_` prefix to avoid clashes."""

    def tandem_capture_routes(self, max_model_len: int) -> bool:
        """Record the experts every request's tokens are routed to from now on (route_capture.py)."""
        self._tandem_routes = RouteCapture(self.model_runner, max_model_len)
        return True

    def tandem_take_routes(self, request_id: str) -> dict[int, list[int]]:
        """The finished request's routes per sample index (flat [position, layer, k])."""
        return self._tandem_routes.take(request_id)

    def tandem_stage(self, source_json: str, version: int) -> int:
        """Read `version` from the source in full and keep it staged; returns the number of tensors."""
        self._tandem_staged = None  # a previous, never-applied version is dropped
        stager = getattr(self, "_tandem_stager", None)
        if stager is None:
            stager = self._tandem_stager = Stager(torch.device(self.device))
        source = source_from_json(source_json)
        workers = _workers()
        if workers is None or not isinstance(source, CollectiveSource):
            staged = stager.read(source, version)
        else:
            group, device_group, source_rank, is_first = workers
            staged = fan_out(lambda: stager.read(source, version), source.plan, group, source_rank, is_first,
                             device_group=device_group, device=torch.device(self.device))
        self._tandem_staged = (version, staged)
        return len(staged)

    def tandem_prepare_pipeline(self) -> bool:
        """vLLM-CPU 0.32 with pipeline parallel and enforce_eager: a later stage's buffer for the
        activations it receives is made only by the compile warm-up, which eager mode skips, so
        its first step fails (`assert self.intermediate_tensors is not None`). Make it here, as
        the warm-up would; returns whether this worker needed it."""
        from vllm.distributed import get_pp_group

        runner = self.model_runner
        if get_pp_group().is_first_rank or runner.intermediate_tensors is not None:
            return False
        runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
            batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device)
        return True

    def tandem_apply_staged(self, version: int) -> int:
        """Load the staged `version` into the model; returns the number of tensors loaded."""
        staged = getattr(self, "_tandem_staged", None)
        self._tandem_staged = None
        if staged is None or staged[0] != version:
            raise RuntimeError(f"weight version {version} is not staged (staged: {staged and staged[0]})")
        return self._tandem_load(iter(staged[1].items()))

    def tandem_write_adapter(self, version: int, directory: str, rank: int, alpha: float, base_model: str) -> int:
        """Write the staged `version`, a LoRA adapter, into `directory` in PEFT's layout (the first
        worker; the others hold the same tensors and drop them); returns the number of tensors."""
        staged = getattr(self, "_tandem_staged", None)
        self._tandem_staged = None
        if staged is None or staged[0] != version:
            raise RuntimeError(f"weight version {version} is not staged (staged: {staged and staged[0]})")
        workers = _workers()
        if workers is not None and not workers[3]:
            return len(staged[1])
        return write_adapter(staged[1], Path(directory), rank, alpha, base_model)

    def tandem_receive_apply(self, source_json: str, version: int) -> dict:
        """Streamed: receive `version` over the weight-sync group and load each bucket into the
        model as soon as its checksum window arrived and passed, while the next ones arrive (a
        single worker, generation paused by the caller). Returns {"applied": number of tensors}, or
        {"applied": 0, "error": ...} when the transfer failed before its first window was whole and
        checked, the model untouched; raises when it failed later, the model then holding weights
        of no version (the caller stops serving until a publish succeeds)."""
        stager = getattr(self, "_tandem_stager", None)
        if stager is None:
            stager = self._tandem_stager = Stager(torch.device(self.device))
        source = source_from_json(source_json)
        if not isinstance(source, CollectiveSource):
            raise TypeError(f"a streamed weight update reads the weight-sync group, not {type(source).__name__}")
        # one core left to the threads that move the bytes while vLLM repacks (receive_threads.py)
        with threads_while_receiving(torch.device(self.device)) as threads:
            return {**self._tandem_receive_apply(stager.stream(source, version)), "reload_threads": threads}

    def _tandem_receive_apply(self, tensors) -> dict:
        try:
            first = next(tensors)  # the header and the first window, checked: nothing of the model touched yet
        except StopIteration:
            return {"applied": 0, "error": "the weight version holds no tensors"}
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which keeps serving
            return {"applied": 0, "error": f"{type(exc).__name__}: {exc}"}

        def chained():
            yield first
            yield from tensors

        applied = self._tandem_load(chained())
        return {"applied": applied, **self._tandem_last_load}

    def tandem_free_weights(self) -> dict:
        """Free the model's weights until the next load (generator_svc/free_weights.py) and hand the
        memory to the kernel for the trainer (tcmalloc would keep it: tandem/host_memory.py);
        returns what was freed."""
        freed = free_weights(self.model_runner.get_model(), freeable_methods())
        return {**freed, "released_by": release_free_memory()}

    def _tandem_load(self, tensors) -> int:
        """Load HF-named `tensors` (an iterator, consumed as vLLM's loader asks for them)."""
        names: set[str] = set()
        waited = 0.0

        def noted():
            nonlocal waited
            source = iter(tensors)
            while True:
                asked = time.perf_counter()
                item = next(source, None)
                waited += time.perf_counter() - asked
                if item is None:
                    return
                names.add(item[0])
                yield item

        started = time.perf_counter()
        try:
            with quiet_unloaded_by_design(self.model_runner.get_model()):  # a tied head gets no tensors (reload_log.py)
                self.model_runner.reload_weights(weights_iterator=noted(), is_checkpoint_format=True)
        except BaseException:
            _end_failed_reload(self.model_runner)
            raise
        reloaded = time.perf_counter()
        model = self.model_runner.get_model()
        repack_moe_experts(model)  # vLLM-CPU 0.32 skips it on updates (moe_repack.py)
        # a tied head is not reloaded: its packed CPU copy would keep the first weights (tied_weights.py)
        refresh_tied_layers(model, unquantized_embedding_methods(), reloaded={name.rpartition(".")[0] for name in names})
        holes = still_freed(model)
        if holes:  # freed while the trainer trained and given no tensors by this version
            raise RuntimeError(f"weight version loaded no tensors for {len(holes)} layer(s) whose weights were freed "
                               f"while training ({', '.join(holes[:4])}{', ...' if len(holes) > 4 else ''})")
        self._tandem_last_load = {"reload_s": round(reloaded - started, 3), "waited_s": round(waited, 3),
                                  "repack_s": round(time.perf_counter() - reloaded, 3)}
        return len(names)


def _end_failed_reload(runner) -> None:
    """After a reload that raised part-way (a streamed transfer that failed, a tensor the model
    refuses), end vLLM's layerwise reload as its own finish would: the layers it did not reach get
    their old tensors back and its loader wrappers are removed, so the model is whole again (its
    weights of no one version: the engine does not serve it) and the next reload works. Without
    this the next one fails ("'Parameter' object has no attribute 'weight_loader'")."""
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    finalize_layerwise_reload(runner.get_model(), runner.vllm_config.model_config)


def _workers():
    """(the generator's CPU group of workers, its device group (NCCL on GPUs), its first worker's
    global rank, whether this is it), or None for a single worker."""
    from vllm.distributed.parallel_state import get_world_group

    world = get_world_group()
    if world.world_size == 1:
        return None
    return world.cpu_group, world.device_group, world.ranks[0], world.rank_in_group == 0
