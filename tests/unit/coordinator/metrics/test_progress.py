"""Progress off a terminal: timestamped lines at a sensible rate (coordinator/metrics/progress.py),
and the start-up wait said in words (coordinator/metrics/progress.py)."""

import io
import re
import time

from rich.console import Console

from coordinator.config import load_config
from coordinator.membership.registry import Member
from coordinator.metrics.progress import RunProgress, describe_startup
from tandem.kinds import ServiceKind

STAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


def _plain(interval_s: float) -> tuple[RunProgress, io.StringIO]:
    out = io.StringIO()
    return RunProgress(Console(file=out, width=80), interval_s=interval_s, tty=False), out


def test_plain_phase_prints_first_and_last_step_and_then_one_line_per_interval():
    progress, out = _plain(interval_s=3600)
    with progress.phase("grpo", total=50) as bar:
        for step in range(1, 51):
            bar.update(step, f"loss {step / 100:.2f}")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines  # step 1, then nothing within the hour until the last step
    assert all(re.match(STAMP, line) for line in lines)
    assert "grpo step 1/50 (2%)" in lines[0] and "loss 0.01" in lines[0] and "left" in lines[0]
    assert "grpo step 50/50 (100%)" in lines[1] and "loss 0.50" in lines[1]


def test_plain_phase_prints_every_step_when_steps_are_slower_than_the_interval():
    progress, out = _plain(interval_s=0.0)
    with progress.phase("sft", total=2000, unit="step") as bar:
        bar.update(50, "loss 2.7")
        bar.update(100, "loss 1.9", total=100)  # stopped early: held-out accuracy reached
    lines = out.getvalue().splitlines()
    assert [re.search(r"sft step (\d+)/(\d+)", line).groups() for line in lines] == [("50", "2000"), ("100", "100")]


def test_a_start_up_wait_says_who_has_registered_every_interval():
    progress, out = _plain(interval_s=0.05)
    state = {"registered": "trainer 0/1"}
    with progress.waiting("starting services", lambda: state["registered"]):
        time.sleep(0.12)
        state["registered"] = "trainer 1/1"
        time.sleep(0.12)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all(re.match(STAMP + r"starting services \(\d+s\): trainer [01]/1$", ln) for ln in lines)
    assert lines[0].endswith("trainer 0/1") and lines[-1].endswith("trainer 1/1")
    time.sleep(0.15)
    assert len(out.getvalue().splitlines()) == len(lines)  # the wait is over: no more lines


def test_notes_are_timestamped_and_lose_their_markup_off_a_terminal():
    progress, out = _plain(interval_s=10)
    progress.note("[yellow]checkpoint at GRPO step 20 (1.2s)[/]")
    assert re.match(STAMP + r"checkpoint at GRPO step 20 \(1\.2s\)$", out.getvalue().strip())


def test_a_terminal_gets_the_rich_bar_not_lines():
    out = io.StringIO()
    progress = RunProgress(Console(file=out, width=100, force_terminal=True), tty=True)
    with progress.phase("grpo", total=2) as bar:
        bar.update(1, "loss 0.1")
        bar.update(2, "loss 0.2")
    assert "━" in out.getvalue() and not re.search(STAMP, out.getvalue())


def test_startup_description_counts_each_kind_against_the_config():
    cfg = load_config(overrides=["cluster.num_generators=2"])
    members = [Member("trainer-1", ServiceKind.TRAINER, "a:1"), Member("generator-1", ServiceKind.GENERATOR, "a:2")]
    assert describe_startup(cfg, members) == "trainer 1/1, generators 1/2, rewards 0/1 (waiting: arithmetic)"
    members.append(Member("reward-1", ServiceKind.REWARD, "a:3", tasks=("arithmetic",)))
    assert describe_startup(cfg, members, trainer=False) == "generators 1/2, rewards 1/1"


def test_startup_description_counts_a_ppo_runs_critic():
    cfg = load_config(overrides=["ppo.critic.cliprange_value=0.2"])
    members = [Member("trainer-1", ServiceKind.TRAINER, "a:1")]
    assert describe_startup(cfg, members).startswith("trainer 1/1, critic 0/1, generators 0/1")
    members.append(Member("critic-1", ServiceKind.CRITIC, "a:2"))
    assert describe_startup(cfg, members).startswith("trainer 1/1, critic 1/1, generators 0/1")
