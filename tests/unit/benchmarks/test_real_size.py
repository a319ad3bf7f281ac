"""benchmarks/real_size.py's pure parts: the PSS sum over a process tree (a made-up /proc and this
process's own), the service pids read from a growing coordinator.log, the peaks, the
checkpoint builder's config and parameter count at a tiny size, and the result file."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from proc_memory import REST, Peaks, ServiceLog, TreeSampler, by_kind, group_pss_kib, pss_kib, read_ppids, tree_pss_kib
from real_size import _portable, parse_args, result_path, resume_order, settings_for
from real_size_model import SHAPES, Shape, build_checkpoint, build_config
from real_size_report import Results, SystemRep, render, tandem_rep
from vs_trl_settings import trl_kwargs


def _fake_proc(root: Path, processes: dict[int, tuple[int, int | None]]) -> Path:
    """pid -> (ppid, PSS KiB or None for a process whose smaps_rollup cannot be read)."""
    for pid, (ppid, pss) in processes.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (odd (name) x) S {ppid} {pid} {pid} 0 -1\n")
        if pss is not None:
            (d / "smaps_rollup").write_text(f"00400000-7ffd0000 ---p 00000000 00:00 0  [rollup]\nRss:  {pss * 2} kB\n"
                                            f"Pss:  {pss} kB\nPss_Anon:  {pss} kB\n")
    (root / "self").mkdir()  # not a pid: skipped
    return root


# 1 (bench) -> 10 (tandem run) -> 20 (trainer: torchrun) -> 21 (rank 0); 10 -> 30 (generator) -> 31 (vLLM engine);
# 10 -> 40 (reward), 10 -> 50 (a helper of the coordinator); 2 and 60 are elsewhere
TREE = {1: (0, 100), 10: (1, 300), 20: (10, 50), 21: (20, 7000), 30: (10, 900), 31: (30, 4000), 40: (10, 200),
        50: (10, 25), 2: (0, 999), 60: (2, 999), 70: (21, None)}


def test_the_tree_sum_counts_every_process_below_the_root_once(tmp_path):
    proc = _fake_proc(tmp_path, TREE)
    assert read_ppids(proc)[21] == 20 and read_ppids(proc)[70] == 21  # comm with spaces and parentheses
    assert pss_kib(70, proc) == 0 and pss_kib(12345, proc) == 0  # unreadable, gone
    assert tree_pss_kib(20, proc) == 7050
    assert tree_pss_kib(1, proc) == 100 + 300 + 50 + 7000 + 900 + 4000 + 200 + 25


def test_a_sample_splits_the_tree_by_service_and_leaves_out_the_root(tmp_path):
    proc = _fake_proc(tmp_path, TREE)
    services = {"trainer": 20, "generator-0": 30, "generator-1": 99, "reward-arithmetic": 40}  # 99: not started yet
    sample = group_pss_kib(1, services, proc)
    assert sample == {"trainer": 7050, "generator-0": 4900, "generator-1": 0, "reward-arithmetic": 200, REST: 325}
    assert by_kind(sample, "coordinator") == {"trainer": 7050, "generator": 4900, "reward": 200, "coordinator": 325}
    assert group_pss_kib(1, {}, proc, include_root=True) == {REST: 12575}


def test_the_tree_sum_of_this_process_and_a_child_is_their_own_pss():
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while pss_kib(child.pid) < 60 << 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        mine, theirs = pss_kib(os.getpid()), pss_kib(child.pid)
        assert theirs >= 60 << 10 and mine > 0
        assert abs(tree_pss_kib(os.getpid()) - (mine + theirs)) < 8 << 10  # this process may move a little
        with TreeSampler(interval_s=0.05) as sampler:  # below this process, which it leaves out
            time.sleep(0.3)
        assert sampler.peaks.samples >= 2 and sampler.peaks.whole >= 60 << 10
        assert sampler.peaks.groups[REST] == sampler.peaks.whole
    finally:
        child.kill()
        child.wait()


def test_peaks_keep_each_group_s_largest_and_the_largest_single_sum():
    peaks = Peaks()
    peaks.add({"trainer": 10, "generator": 1})
    peaks.add({"trainer": 2, "generator": 5})
    assert peaks.groups == {"trainer": 10, "generator": 5} and peaks.whole == 11  # not 15
    assert peaks.at_whole == {"trainer": 10, "generator": 1} and peaks.samples == 2


def test_the_service_log_reads_started_services_as_the_log_grows(tmp_path):
    log = tmp_path / "coordinator.log"
    read = ServiceLog(log)
    assert read() == {}  # no log yet
    started = {"event": "service_started", "name": "trainer", "pid": 20, "log": "x"}
    log.write_text(json.dumps(started) + "\nnot json\n" + json.dumps({"event": "other", "pid": 1})[:10])
    assert read() == {"trainer": 20}
    with open(log, "a") as f:  # the cut line completes; a restart gives the trainer a new pid
        f.write(json.dumps({"event": "other", "pid": 1})[10:] + "\n" + json.dumps({**started, "pid": 22}) + "\n"
                + json.dumps({"event": "service_started", "name": "generator-0", "pid": 30}) + "\n")
    assert read() == {"trainer": 22, "generator-0": 30}


def test_the_shapes_are_the_qwen_configs_and_count_their_parameters():
    half, one_and_half = SHAPES["0.5b"], SHAPES["1.5b"]
    assert (half.hidden_size, half.num_layers, half.num_heads, half.num_kv_heads, half.intermediate_size,
            half.vocab_size, half.tie_word_embeddings) == (896, 24, 14, 2, 4864, 151_936, True)
    assert (one_and_half.hidden_size, one_and_half.num_layers, one_and_half.num_heads, one_and_half.num_kv_heads,
            one_and_half.intermediate_size, one_and_half.vocab_size) == (1536, 28, 12, 2, 8960, 151_936)
    assert half.parameter_count() == 494_032_768  # Qwen2.5-0.5B: 0.49B
    assert one_and_half.parameter_count() == 1_543_714_304  # Qwen2.5-1.5B: 1.54B


def test_the_checkpoint_builder_writes_a_tied_bf16_qwen2_at_a_tiny_size(tmp_path):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from coordinator.embedded.tiny_model import build_char_tokenizer

    shape = Shape("tiny", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                  vocab_size=1000)
    config = build_config(shape, build_char_tokenizer())
    assert (config.num_hidden_layers, config.num_key_value_heads, config.vocab_size) == (2, 1, 1000)
    info = build_checkpoint(tmp_path, shape)
    assert info["parameters"] == shape.parameter_count()
    saved = AutoConfig.from_pretrained(tmp_path)
    assert saved.architectures == ["Qwen2ForCausalLM"] and saved.tie_word_embeddings
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
        assert {str(f.get_tensor(k).dtype) for k in names} == {"torch.bfloat16"}
        assert "lm_head.weight" not in names  # tied
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer("12+34=").input_ids
    assert ids[0] == saved.bos_token_id and max(ids) < shape.vocab_size
    assert tokenizer.decode(tokenizer("46").input_ids, skip_special_tokens=True) == "46"


def test_the_workload_is_the_issue_s_on_both_sides():
    s = settings_for(4)
    kwargs = trl_kwargs(s, "out")
    assert (kwargs["per_device_train_batch_size"], kwargs["num_generations"], kwargs["max_completion_length"],
            kwargs["beta"], kwargs["bf16"], kwargs["max_steps"]) == (32, 8, 8, 0.01, False, 4)


def _rep(system: str, whole: int) -> SystemRep:
    peaks = Peaks()
    peaks.add({"trl": whole} if system == "trl" else {"trainer": whole // 2, "generator": whole // 4,
                                                      "coordinator": whole // 4})
    return SystemRep(system, [50.0, 44.0, 46.0], {"generate": 12.0, "train": 30.0}, 9.0, peaks,
                     publish_phase_s=[6.0, 7.0] if system != "trl" else [], publish_send_s=[2.0, 3.0],
                     publish_bytes=988 << 20, checkpoint_s=[15.0, 15.0] if system != "trl" else [])


def test_the_result_file_holds_every_figure(tmp_path):
    import argparse
    import datetime

    results = Results(machine="machine: 2 cores", command="PYTHONPATH=. python benchmarks/real_size.py",
                      shape=SHAPES["0.5b"], model={"parameters": 494_032_768, "bytes": 988 << 20, "seconds": 20.0},
                      settings=settings_for(4), save_every=2,
                      reps={"trl": [_rep("trl", 11 << 20)], "tandem": [_rep("tandem", 20 << 20)]},
                      publish_bytes=988 << 20, broadcast_s=[0.5, 0.4, 0.6], checkpoint_bytes=6 << 30,
                      disk_s=(6.0, 3.0), resumes=[{"resume_s": 12.5, "publish_s": 2.0}])
    text = render(results)
    assert "# Tandem and TRL at the Qwen2.5-0.5B shape (494.0M parameters)" in text
    assert "| tandem | 1 | 50.00, 44.00, 46.00 | 45.00 | 9.0 | generate 12.00, train 30.00 |" in text
    assert "tandem / TRL median s/step: 1.00x" in text
    assert "| tandem | 1 | 20.00 | 5.00 | 5.00 | 10.00 | - |" in text and "| trl | 1 | 11.00 | - | - | - | 11.00 |" in text
    assert "raw gloo broadcast" in text and "0.50 (0.40-0.60) s" in text
    assert "time_publish_s): 6.50 (6.00-7.00) s over 2; 13.00x the raw broadcast" in text
    assert "a save 15.00 (15.00-15.00) s, 2 save(s)" in text and "(6.00 GiB)" in text
    assert "write + fsync 6.00 s (1.00 GiB/s), cold read 3.00 s (2.00 GiB/s)" in text
    assert "timings_s.resume_s 12.50 s" in text and "(that publish: 2.00 s" in text and "publish: 10.50 s" in text
    assert "- tandem rep 1: 0 member(s) declared lost" in text
    assert "/tmp" not in text
    assert _portable(["--quick", "--work-dir", "/tmp/w", "--out=/tmp/r.md", "--reps", "2"]) == ["--quick", "--reps", "2"]
    args = argparse.Namespace(out=None, shape="0.5b")
    assert result_path(args, datetime.date(2026, 11, 28)) == BENCHMARKS / "results" / "2026-11-28-real-size.md"
    assert result_path(argparse.Namespace(out=None, shape="quick"), datetime.date(2026, 11, 28)).name == \
        "2026-11-28-real-size-quick.md"


def test_resumes_alternate_their_reads_in_abba_order_and_report_each_and_the_medians():
    assert resume_order(["direct", "buffered"], 6) == ["direct", "buffered", "buffered", "direct", "direct", "buffered"]
    assert resume_order([], 2) == ["", ""]
    with pytest.raises(SystemExit):
        parse_args(["--resume-reads", "direct,cached"])
    results = Results(machine="m", command="c", shape=SHAPES["0.5b"], model={"parameters": 1, "bytes": 2, "seconds": 1.0},
                      settings=settings_for(4), save_every=2,
                      resumes=[{"reads": "direct", "resume_s": 20.0, "publish_s": 12.0, "reload_s": 7.0, "waited_s": 0.1,
                                "step_s": 30.0, "wall_s": 90.0},
                               {"reads": "buffered", "resume_s": 18.0, "publish_s": 2.0, "step_s": 28.0, "wall_s": 80.0},
                               {"reads": "buffered", "resume_s": 30.0, "publish_s": 4.0, "step_s": None, "wall_s": 70.0},
                               {"reads": "direct", "resume_s": 10.0, "publish_s": 2.0, "step_s": 20.0, "wall_s": 60.0}])
    text = render(results)
    assert "| 1 | direct | 20.00 | 12.00 | 7.00 | 0.10 | 8.00 | 30.00 | 90.00 |" in text
    assert "| 3 | buffered | 30.00 | 4.00 | - | - | 26.00 | - | 70.00 |" in text
    assert "- direct (2): median resume_s 15.00, publish 7.00 (reload 7.00), resumed step 25.00, wall 75.00 s" in text
    assert "- buffered (2): median resume_s 24.00, publish 3.00 (reload nan), resumed step 28.00, wall 75.00 s" in text


def test_each_resume_starts_from_the_finished_run_s_summary_and_reads_its_own_figures(tmp_path, monkeypatch):
    """Bench.resume around a stand-in for `tandem run --resume` (the real one is the benchmark's
    run): every resume sees the run's own summary (a resumed run rewrites it as finished at step
    5, and the next resume would then do nothing), gets its checkpointing.direct_io, and reports
    the figures its own run logged, not the ones before it."""
    import real_size

    run = tmp_path / "tandem-0" / "run"
    (run / "logs").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"steps": 4}))
    (run / "metrics.jsonl").write_text(json.dumps({"phase": "grpo", "step": 4, "time_step_s": 1.0}) + "\n")
    (run / "logs" / "coordinator.log").write_text(json.dumps({"event": "weights_published", "seconds": 1.0}) + "\n")
    launches = []

    def fake_run(overrides, log_path):
        summary = json.loads((run / "summary.json").read_text())
        launches.append((summary["steps"], [o for o in overrides if o.startswith("checkpointing.direct_io")]))
        n = len(launches)
        (run / "summary.json").write_text(json.dumps({"steps": 5, "timings_s": {"resume_s": 10.0 * n}}))
        (run / "metrics.jsonl").write_text(json.dumps({"phase": "grpo", "step": 5, "time_step_s": 2.0 * n}) + "\n")
        with open(run / "logs" / "coordinator.log", "a") as log:
            log.write(json.dumps({"event": "weights_published", "seconds": float(n)}) + "\n")
        with open(run / "logs" / "generator-0.log", "a") as log:
            log.write(json.dumps({"event": "weights_swapped", "reload_s": 0.5 * n, "waited_s": 0.1}) + "\n")
        return time.time()

    monkeypatch.setattr(real_size, "run_tandem", fake_run)
    monkeypatch.setattr(real_size, "evict", lambda path: None)
    bench = object.__new__(real_size.Bench)
    bench.args, bench.settings = parse_args(["--resumes", "2"]), settings_for(4)
    monkeypatch.setattr(bench, "overrides", lambda rep_dir, extra: [])
    first = bench.resume(run.parent, "tandem", "direct")
    second = bench.resume(run.parent, "tandem", "buffered")
    assert launches == [(4, ["checkpointing.direct_io=true"]), (4, ["checkpointing.direct_io=false"])]
    assert (first["resume_s"], first["publish_s"], first["reload_s"], first["step_s"]) == (10.0, 1.0, 0.5, 2.0)
    assert (second["resume_s"], second["publish_s"], second["reload_s"], second["step_s"]) == (20.0, 2.0, 1.0, 4.0)
    assert second["reads"] == "buffered" and parse_args([]).resume_reads == []


def test_a_tandem_run_directory_gives_its_figures(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = [{"phase": "val", "step": 0, "time": 100.0},
            *({"phase": "grpo", "step": i, "time": 100.0 + 10 * i, "time_rollout_s": 2.0 + i, "time_train_s": 5.0,
               "time_publish_s": 1.0 + i, "time_step_s": 9.0, "token_mult_prob_error": 1.0 + i * 1e-6}
              for i in (1, 2, 3))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = [{"event": "weights_published", "seconds": 0.5, "bytes": 1000}, {"event": "checkpoint_saved"},
              {"event": "weights_published", "seconds": 0.7, "bytes": 1000},
              {"event": "member_lost", "member_id": "m3", "kind": "trainer"}]
    (logs / "coordinator.log").write_text("".join(json.dumps(e) + "\n" for e in events))
    (logs / "trainer.log").write_text("torchrun noise\n" + json.dumps({"event": "weights_published",
                                                                        "duration_ms": 400}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"timings_s": {"checkpoint_s": 3.0}}))
    rep = tandem_rep("tandem", tmp_path, 95.0, Peaks(), "cmd")
    assert rep.step_s == [10.0, 10.0, 10.0] and rep.startup_s == 5.0
    assert rep.phases == {"publish": 3.5, "rollout": 4.5, "train": 5.0}  # medians of steps 2 and 3
    assert rep.publish_phase_s == [2.0, 3.0, 4.0] and rep.publish_send_s == [0.5, 0.7]
    assert rep.publish_trainer_s == [0.4] and rep.publish_bytes == 1000 and rep.checkpoint_s == [3.0]
    assert rep.members_lost == ["trainer:m3"]
    assert rep.token_mult_prob_error == [1.000001, 1.000002, 1.000003]
