"""Chaos that loses nothing (benchmarks/chaos.py, CI-sized): one real `tandem run` (GRPO on the
embedded tiny model, 2 torchrun trainer ranks, 1 vLLM generator, 1 reward service, fp32, a
checkpoint every step) takes ten faults drawn from a fixed seed, one of each kind, at random
moments: SIGKILL and SIGSTOP/SIGCONT of the generator, the reward service, a trainer rank, the
torchrun agent and the coordinator (killed, then the same command run again, as a user would).

The checker's verdict must be "equal to the fault-free run": every GRPO step's loss, rewards,
grad norm, KL, ... and the exported final weights equal those of the same seed's run without
faults (run alongside: the two share the cores, which slows recoveries but changes no result),
nothing the run started is left running, and the run directory
holds every checkpoint it claims. Prints every fault with its time to recover (pytest -s).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.chaos import FaultKind, Nemesis, check, figures, reference, schedule
from benchmarks.chaos_check import stop_everything

pytestmark = pytest.mark.integration

SEED, STEPS = 3, 40


def test_ten_faults_of_ten_kinds_and_the_run_equals_the_fault_free_one(tmp_path):
    plan = schedule(SEED, len(FaultKind), rate_per_min=60.0, kinds=list(FaultKind), max_hang_s=4.0)
    assert {f.kind for f in plan} == set(FaultKind)
    nemesis = Nemesis(tmp_path / "chaos", STEPS, SEED, plan)
    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(reference, tmp_path / "reference", STEPS, SEED)
            outcome = nemesis.run()
            straight = running.result()
        verdict = check(straight.run_dir, outcome.run_dir, outcome.home)
    finally:
        stop_everything(tmp_path / "chaos" / "home")
        stop_everything(tmp_path / "reference" / "home")
    assert straight.returncode == 0, (tmp_path / "reference" / "console-1.txt").read_text()[-3000:]
    assert outcome.returncode == 0, nemesis.console()[-5000:]
    result = figures(outcome, verdict, SEED, STEPS, 60.0)
    print(f"\n{result['faults_survived']} faults survived of {len(plan)} planned; recovery (s) by kind: "
          f"{result['recover_s']}; verdict: {verdict.text}")
    survived = [f for f in outcome.faults if f.recovered_s is not None]
    assert len(survived) >= 10 and len({f.kind for f in survived}) >= 6, (outcome.faults, outcome.skipped)
    assert verdict.text.startswith("equal to the fault-free run"), verdict.problems
    assert outcome.launches == 2  # the coordinator was killed once and run again
