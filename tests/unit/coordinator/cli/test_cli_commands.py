"""The commands that start no service: `tandem config` (each key's source), `tandem run --dry-run`
(what it checks, that it starts nothing), `tandem status` with no run and in a narrow terminal."""

import io
import json

from rich.console import Console

from coordinator.cli.main import main
from coordinator.cli.status import print_status, show_status
from coordinator.membership.client import MemberView, RunStatusView
from tandem.kinds import ServiceKind
from tests import procs


def _sources(text: str) -> dict[str, str]:
    """'section.key' -> source, from `tandem config` output (two-space indents)."""
    found, path = {}, []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        key = line.strip().split(":")[0]
        path = path[:depth] + [key]
        if "  # " in line:
            found[".".join(path)] = line.rsplit("  # ", 1)[1]
    return found


def test_config_prints_each_keys_source(tmp_path, capsys):
    recipe = tmp_path / "exp.yaml"
    recipe.write_text("grpo:\n  max_num_steps: 7\npolicy:\n  train_micro_batch_size: 32\n")
    assert main(["config", str(recipe), "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=32"]) == 0
    sources = _sources(capsys.readouterr().out)
    assert sources["grpo.max_num_steps"] == "file" and sources["policy.train_micro_batch_size"] == "file"
    assert sources["grpo.num_prompts_per_step"] == "override"
    assert sources["grpo.seed"] == "default"
    assert sources["sft.max_num_steps"] == "derived: the embedded tiny model's"
    assert sources["sft.near_target_val_period"] == "derived: the embedded tiny model's"
    assert sources["data.default_task"] == "derived: the env's one task"


def test_config_error_is_one_line(capsys):
    assert main(["config", "grpo.num_prompt_per_step=4"]) == 2
    assert "unknown key grpo.num_prompt_per_step" in capsys.readouterr().err


def test_dry_run_checks_the_data_and_starts_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n")
    argv = ["run", "--dry-run", "data.dataset_name=jsonl", f"data.train_path={train}", "logger.log_dir=runs"]
    assert main(argv) == 2
    out = capsys.readouterr().err
    assert "FAIL data" in out and "train.jsonl: row 2 has no 'prompt' (or 'messages') and 'answer'" in out and "nothing was started" in out
    train.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "task": "math"}) + "\n")
    assert main(argv) == 2
    assert "names tasks ['math'] with no env section" in capsys.readouterr().err
    train.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    assert main(argv) == 0
    out = capsys.readouterr().err
    assert "ok   data      " in out and "1 rows" in out and "ok   config" in out
    assert not (tmp_path / "runs").exists()


def test_status_says_plainly_that_no_run_is_in_progress(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert show_status(None, None, Console(file=out, width=80)) == 1
    assert out.getvalue().startswith("no run in progress")
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    (run / "coordinator.addr").write_text(f"0.0.0.0:{procs.free_port()}")  # a finished run's, nothing answers
    (run / "token").write_text("t")
    (run / "summary.json").write_text("{}")
    out = io.StringIO()
    assert show_status(None, None, Console(file=out, width=80)) == 1
    text = " ".join(out.getvalue().split())  # wrapped at the console's width
    assert text.startswith("no run in progress at 127.0.0.1:") and "the last run finished" in text
    assert "UNAVAILABLE" not in text and "Traceback" not in text


def _status() -> RunStatusView:
    members = (MemberView("generator-0123abcd", ServiceKind.GENERATOR, "10.0.0.2:41000", 3, 12, 250, (), 256, 4242, "healthy"),
               MemberView("reward-89abcdef", ServiceKind.REWARD, "10.0.0.3:42000", 0, 0, 300, ("arithmetic",), 0, 4343,
                          "healthy"))
    return RunStatusView("20261124-demo", "sft", 40, 2000, 3, members, {})


def test_status_wraps_cleanly_in_a_narrow_terminal_and_shows_no_weights_for_rewards():
    out = io.StringIO()
    print_status(_status(), Console(file=out, width=50))
    lines = out.getvalue().splitlines()
    assert lines[0] == "run 20261124-demo: sft step 40/2000, weights v3"
    assert all(len(line) <= 50 for line in lines)
    assert "  weights   v3" in lines and "  weights   -" in lines  # a reward service serves no weights
    assert "  address   10.0.0.2:41000" in lines and "  kind      reward (arithmetic)" in lines
    wide = io.StringIO()
    print_status(_status(), Console(file=wide, width=140))
    assert "10.0.0.2:41000" in wide.getvalue() and "…" not in wide.getvalue()
