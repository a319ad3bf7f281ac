"""Malformed configs, model files and data files through the real `tandem run` (a subprocess each,
a few at a time): every one exits 2 within seconds with one message that names the key or the
file and says what to change, no traceback, nothing of a run created and no process left.
Prints the slowest case's wall time (pytest -s shows it)."""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coordinator.embedded.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.integration

DATA = ["data.dataset_name=jsonl"]
ROW = {"prompt": "12+34=", "answer": "46"}


def _model_variants(ws: Path) -> None:
    """Copies of the embedded model, each damaged in one way."""
    good = ensure_tiny_model(ws / "home")
    damage = {
        "model_cfg_corrupt": lambda m: (m / "config.json").write_text('{"model_type": "llama",'),
        "model_cfg_empty": lambda m: (m / "config.json").write_text("{}"),
        "model_truncated": lambda m: os.truncate(m / "model.safetensors", 1 << 20),  # of its 4 MB
        "model_bad_header": lambda m: (m / "model.safetensors").write_bytes(struct.pack("<Q", 6) + b"\x00" * 64),
        "model_no_weights": lambda m: (m / "model.safetensors").unlink(),
        "model_no_tokenizer": lambda m: [(m / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
        "model_bad_tokenizer": lambda m: (m / "tokenizer.json").write_text("not json"),
        "model_bad_tokenizer_config": lambda m: (m / "tokenizer_config.json").write_bytes(b"\xff\xfe"),
    }
    for name, hurt in damage.items():
        shutil.copytree(good, ws / name)
        hurt(ws / name)


def _files(ws: Path) -> None:
    lines = {
        "good.jsonl": json.dumps(ROW) + "\n",
        "empty.jsonl": "",
        "blank.jsonl": "\n  \n\n",
        "bad_json.jsonl": json.dumps(ROW) + '\n{"prompt": "1+1=", \n',
        "non_object.jsonl": json.dumps(ROW) + "\n[1, 2]\n",
        "string_row.jsonl": '"12+34="\n',
        "no_prompt.jsonl": json.dumps({"answer": "4"}) + "\n",
        "no_answer.jsonl": json.dumps({"prompt": "2+2="}) + "\n",
        "null_prompt.jsonl": json.dumps({"prompt": None, "answer": "4"}) + "\n",
        "unknown_task.jsonl": json.dumps({**ROW, "task": "nope"}) + "\n",
        "long_prompt.jsonl": json.dumps({"prompt": "1+" * 50 + "1=", "answer": "51"}) + "\n",
        "pairs_no_rejected.jsonl": json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n",
        "broken.yaml": "grpo: [1\n",
        "list.yaml": "- a\n- b\n",
        "typo.yaml": "grpoo:\n  max_num_steps: 1\n",
        "nul.yaml": "grpo:\n  max_num_steps: 1\x00\n",
        "afile": "not a directory\n",
    }
    for name, text in lines.items():
        (ws / name).write_text(text)
    (ws / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xd8\x00\x01")
    (ws / "binary.jsonl").write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n' + bytes(range(128, 256)))
    (ws / "adir").mkdir()


def _cases(ws: Path) -> list[tuple[str, list[str], str]]:
    """(id, arguments of `tandem run`, text the message must hold)."""
    return _data_cases(str(ws)) + _model_cases(str(ws)) + _config_cases(str(ws))


def _data_cases(w: str) -> list[tuple[str, list[str], str]]:
    return [
        ("train_missing", [*DATA, "data.train_path=missing.jsonl"], "data.train_path: missing.jsonl does not exist"),
        ("train_directory", [*DATA, f"data.train_path={w}/adir"], "adir is a directory"),
        ("train_empty", [*DATA, f"data.train_path={w}/empty.jsonl"], "empty.jsonl holds no examples"),
        ("train_blank_lines", [*DATA, f"data.train_path={w}/blank.jsonl"], "blank.jsonl holds no examples"),
        ("train_binary", [*DATA, f"data.train_path={w}/binary.jsonl"], "binary.jsonl: not UTF-8 text"),
        ("train_bad_json", [*DATA, f"data.train_path={w}/bad_json.jsonl"], "bad_json.jsonl:2: not a JSON object"),
        ("train_non_object", [*DATA, f"data.train_path={w}/non_object.jsonl"], "non_object.jsonl:2: a row must be"),
        ("train_string_row", [*DATA, f"data.train_path={w}/string_row.jsonl"], "string_row.jsonl:1: a row must be"),
        ("train_no_prompt", [*DATA, f"data.train_path={w}/no_prompt.jsonl"], "no_prompt.jsonl: row 1 has no 'prompt'"),
        ("train_no_answer", [*DATA, f"data.train_path={w}/no_answer.jsonl"], "and 'answer'; its keys: ['prompt']"),
        ("train_null_prompt", [*DATA, f"data.train_path={w}/null_prompt.jsonl"], "null_prompt.jsonl: row 1 has no 'prompt'"),
        ("train_unknown_task", [*DATA, f"data.train_path={w}/unknown_task.jsonl"], "names tasks ['nope']"),
        ("train_prompt_key", [*DATA, f"data.train_path={w}/good.jsonl", "data.prompt_key=question"],
         "row 1 has no 'question'"),
        ("train_too_long", [*DATA, f"data.train_path={w}/long_prompt.jsonl"], "too long for the generators"),
        ("val_missing", [*DATA, f"data.train_path={w}/good.jsonl", "data.val_path=nope.jsonl"], "data.val_path"),
        ("val_bad", [*DATA, f"data.train_path={w}/good.jsonl", f"data.val_path={w}/bad_json.jsonl"],
         "data.val_path: " + f"{w}/bad_json.jsonl:2"),
        ("pairs_no_rejected", ["dpo={}", *DATA, f"data.train_path={w}/pairs_no_rejected.jsonl"],
         "missing keys ['rejected']"),
    ]


def _model_cases(w: str) -> list[tuple[str, list[str], str]]:
    return [
        ("model_missing", ["policy.model_name=no_such_model"], "policy.model_name"),
        ("model_is_a_file", [f"policy.model_name={w}/afile"], "policy.model_name"),
        ("model_cfg_corrupt", [f"policy.model_name={w}/model_cfg_corrupt"], "config.json is not valid JSON"),
        ("model_cfg_empty", [f"policy.model_name={w}/model_cfg_empty"], "config.json names no model_type"),
        ("model_truncated", [f"policy.model_name={w}/model_truncated"], "model.safetensors: tensor"),
        ("model_bad_header", [f"policy.model_name={w}/model_bad_header"], "corrupt safetensors header"),
        ("model_no_weights", [f"policy.model_name={w}/model_no_weights"], "holds no weights"),
        ("model_no_tokenizer", [f"policy.model_name={w}/model_no_tokenizer"], "holds no tokenizer"),
        ("model_bad_tokenizer", [f"policy.model_name={w}/model_bad_tokenizer"], "tokenizer.json is not valid JSON"),
        ("model_bad_tokenizer_config", [f"policy.model_name={w}/model_bad_tokenizer_config"],
         "tokenizer_config.json is not valid JSON"),
        ("reward_model_cfg_empty", ["env.arithmetic.scorer=reward_model",
                                    f"env.arithmetic.reward_model.model_name={w}/model_cfg_empty"],
         "env.arithmetic.reward_model.model_name"),
    ]


def _config_cases(w: str) -> list[tuple[str, list[str], str]]:
    return [
        ("config_missing", ["missing.yaml"], "missing.yaml does not exist"),
        ("config_directory", [f"{w}/adir"], "adir is a directory"),
        ("config_binary", [f"{w}/binary.yaml"], "binary.yaml is not UTF-8 text"),
        ("config_nul", [f"{w}/nul.yaml"], "nul.yaml is not valid YAML"),
        ("config_broken_yaml", [f"{w}/broken.yaml"], "broken.yaml is not valid YAML"),
        ("config_list", [f"{w}/list.yaml"], "list.yaml must hold a mapping"),
        ("config_unknown_section", [f"{w}/typo.yaml"], "unknown key grpoo"),
        ("override_unknown_key", ["grpo.max_num_stepz=3"], "unknown key grpo.max_num_stepz"),
        ("override_wrong_type", ["grpo.max_num_steps=lots"], "grpo.max_num_steps"),
        ("override_negative", ["grpo.num_prompts_per_step=-1"], "grpo.num_prompts_per_step"),
        ("override_bad_yaml", ["grpo.max_num_steps=[1"], "the value of grpo.max_num_steps is not valid YAML"),
        ("override_empty_part", ["grpo..max_num_steps=1"], "must look like section.key=value"),
        ("override_into_a_value", ["grpo.max_num_steps.x=1"], "grpo.max_num_steps"),
        ("unknown_scorer", ["env.arithmetic.scorer=bogus"], "env.arithmetic.scorer"),
        ("unknown_default_task", ["data.default_task=nope"], "data.default_task"),
        ("jsonl_without_train_path", [*DATA], "data.train_path"),
        ("zero_trainer_ranks", ["cluster.trainer_ranks=0"], "cluster.trainer_ranks"),
        ("max_new_tokens_past_max_model_len", ["policy.generation.max_new_tokens=100"],
         "policy.generation.max_new_tokens (100) leaves no room"),
        ("max_total_sequence_length_cuts_all", ["policy.max_total_sequence_length=8",
                                                "policy.generation.vllm_cfg.max_model_len=64"],
         "exceed policy.max_total_sequence_length (8)"),
        ("max_total_sequence_length_no_room", ["policy.max_total_sequence_length=4"],
         "max_new_tokens (4) leaves no room for a prompt"),
        ("kv_cache_past_memory", ["policy.generation.vllm_cfg.kv_cache_space_gib=100000"],
         "kv_cache_space_gib: 100000 GiB"),
        ("run_name_absolute", ["logger.run_name=/tmp/escape"], "logger.run_name: '/tmp/escape' is not a plain name"),
        ("run_name_dotdot", ["logger.run_name=../escape"], "logger.run_name: '../escape' is not a plain name"),
        ("log_dir_a_file", [f"logger.log_dir={w}/afile"], "logger.log_dir: " + f"{w}/afile is a file"),
        ("log_dir_under_a_file", [f"logger.log_dir={w}/afile/runs"], "logger.log_dir: cannot create or write"),
        ("log_dir_uncreatable", ["logger.log_dir=/proc/tandem-runs"], "logger.log_dir: cannot create or write"),
        ("checkpoint_dir_uncreatable", ["checkpointing.checkpoint_dir=/proc/tandem-ckpt"],
         "checkpointing.checkpoint_dir: cannot create or write"),
        ("checkpoint_dir_a_file", [f"checkpointing.checkpoint_dir={w}/afile"], "checkpointing.checkpoint_dir"),
        ("resume_without_run_name", ["--resume"], "--resume needs logger.run_name"),
        ("resume_nothing", ["--resume", "logger.run_name=never_ran"], "nothing to resume"),
    ]


def _processes_in(cwd: Path) -> list[int]:
    """Processes (of this user) whose working directory is cwd: what a case may have started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == cwd:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _run_case(ws: Path, case: tuple[str, list[str], str]) -> tuple[str, int, str, float, list[int], list[str]]:
    name, args, _ = case
    cwd = ws / "cases" / name
    cwd.mkdir(parents=True)
    env = {**os.environ, "TANDEM_HOME": str(ws / "home"), "COLUMNS": "1000", "OMP_NUM_THREADS": "1"}
    env.pop("TANDEM_TOKEN", None)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli.main", "run", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:  # a run that started after all: stop it and all it launched
        proc.kill()
        out = proc.communicate()[0] + "\n(timed out)"
    wall = time.monotonic() - started
    left = _processes_in(cwd)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return name, proc.returncode, out, wall, left, sorted(os.listdir(cwd))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("bad_inputs")
    _model_variants(ws)
    _files(ws)
    return ws


def test_every_malformed_input_is_one_clear_error_before_anything_starts(workspace):
    cases = _cases(workspace)
    assert len(cases) >= 40
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda case: _run_case(workspace, case), cases))
    problems = []
    for (name, _, expected), (_, code, out, wall, left, created) in zip(cases, results):
        flat = " ".join(out.split())
        if code != 2 or expected not in flat or "Traceback" in out or wall > 60 or left or created:
            problems.append(f"{name}: exit {code}, {wall:.1f}s, processes left {left}, created {created}, "
                            f"expected {expected!r} in:\n{out[-1500:]}")
    assert not problems, "\n\n".join(problems)
    slowest = max(results, key=lambda r: r[3])
    print(f"\n{len(cases)} malformed inputs: each exit 2; slowest {slowest[0]} {slowest[3]:.1f}s "
          f"(3 at a time), median {sorted(r[3] for r in results)[len(results) // 2]:.1f}s")


def test_resume_of_a_finished_run_says_so_and_changes_nothing(workspace):
    run_dir = workspace / "cases" / "finished" / "runs" / "done"
    run_dir.mkdir(parents=True)
    summary = run_dir / "summary.json"
    summary.write_text(json.dumps({"grpo_steps": 3, "wall_time_s": 12.5}))
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    env = {**os.environ, "TANDEM_HOME": str(workspace / "home"), "COLUMNS": "1000"}
    proc = subprocess.run([sys.executable, "-m", "coordinator.cli.main", "run", "logger.log_dir=runs",
                           "logger.run_name=done", "grpo.max_num_steps=3", "--resume"],
                          cwd=workspace / "cases" / "finished", env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run done has finished its 3 GRPO steps" in " ".join((proc.stdout + proc.stderr).split())
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before  # nothing written, nothing added
