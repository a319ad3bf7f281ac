"""benchmarks/phase_profile.py: a perf profile cut by a run's train and publish phases."""

from __future__ import annotations

import datetime
import json

from benchmarks.phase_profile import by_object, parse_perf_script, profile, run_phases

T0 = 1796206500.0  # 2026-12-02T10:15:00Z


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def _run(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"phase": "grpo", "step": 1, "time_train_s": 10.0}) + "\n")
    (tmp_path / "logs" / "trainer.log").write_text(
        json.dumps({"rank": 0, "global_step": 1, "event": "train_step", "timestamp": _iso(T0 + 10)}) + "\n")
    (tmp_path / "logs" / "coordinator.log").write_text("\n".join([
        json.dumps({"version": 1, "seconds": 2.0, "event": "weights_published", "timestamp": _iso(T0 - 3)}),
        json.dumps({"event": "step", "timestamp": _iso(T0 + 11)}),  # not a phase
    ]) + "\n")
    return tmp_path


# perf script -F comm,pid,time,ip,sym: a header per sample, its stack innermost first, a blank line
PERF = """\
          python 22912 {t1}:
\tffffffffa1b2c3d4 clear_page_erms
\tffffffffa1b2c3e0 folio_zero_user
\t7f77609dec00 at::native::fill_kernel

          python 22912 {t2}:
\t7f77609dec00 at::native::add_kernel
\t7f77609de4a8 GOMP_parallel

         swapper     0 {t2}:
\tffffffffa1000000 default_idle

 VLLM::EngineCor 30001 {t3}:
\tffffffffa1b2c3d4 clear_page_erms
\t7f774c820084 [unknown]

          python 22912 {t4}:
\tffffffffa1b2c3d4 clear_page_erms
"""


def test_phases_come_from_the_runs_own_events_in_time_order(tmp_path):
    phases = run_phases(_run(tmp_path))
    assert [(p.kind, round(p.start - T0, 3), round(p.end - T0, 3)) for p in phases] == [
        ("publish", -5.0, -3.0), ("train", 0.0, 10.0)]


def test_each_phase_counts_its_busy_samples_and_those_zeroing_pages(tmp_path):
    text = PERF.format(t1=f"{T0 + 1:.6f}", t2=f"{T0 + 2:.6f}", t3=f"{T0 - 4:.6f}", t4=f"{T0 + 20:.6f}")
    samples = list(parse_perf_script(text.splitlines()))
    assert [(s.comm, "clear_page" in s.top) for s in samples] == [
        ("python", True), ("python", False), ("swapper", False), ("VLLM::EngineCor", True), ("python", True)]
    rows = profile(run_phases(_run(tmp_path)), samples, hz=1)
    # the publish: the engine's one sample, zeroing; the train phase: two busy, one zeroing (the idle
    # task's sample is not busy; the sample after the phase belongs to none)
    assert [(p.kind, busy, zeroing) for p, busy, zeroing in rows] == [("publish", 1, 1), ("train", 2, 1)]


# the same with `dso` among the fields: each frame ends with its shared object
PERF_DSO = """\
 VLLM::EngineCor 30001 {t}:
\t7f77609dec00 gomp_barrier_wait_end (/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1)

 VLLM::EngineCor 30001 {t}:
\t7f774c820084 [unknown] (/tmp/perf-30001.map)

 VLLM::EngineCor 30001 {t}:
\t7f77609dec10 gomp_team_barrier_wait_end (/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1)

   gloo_tcp_loop 22912 {t}:
\tffffffffa1b2c3d4 _copy_to_iter ([kernel.kallsyms])
"""


def test_each_phase_names_the_processes_and_shared_objects_that_took_its_cpu(tmp_path):
    samples = list(parse_perf_script(PERF_DSO.format(t=f"{T0 - 4:.6f}").splitlines()))
    assert [s.object for s in samples] == ["libgomp.so.1", "perf-30001.map", "libgomp.so.1", "[kernel.kallsyms]"]
    (publish, rows), (train, none) = by_object(run_phases(_run(tmp_path)), samples, hz=1, top=2)
    assert (publish.kind, rows) == ("publish", [("VLLM::EngineCor", "libgomp.so.1", 2), ("VLLM::EngineCor", "perf-30001.map", 1)])
    assert (train.kind, none) == ("train", [])
    assert next(parse_perf_script(PERF.format(t1="1.0", t2="2.0", t3="3.0", t4="4.0").splitlines())).object == ""
