"""The rollout pipeline against a fake producer whose generators serve the published version: the
synchronous pipeline (age 0) never runs ahead, the async one runs at most max_age batches ahead,
no group older than the bound is ever handed out (a stale one is replaced and counted), each
batch keeps the cursor after its own prompts, and a producer error surfaces in its step."""

import threading
import time

import pytest
import structlog
import torch

from coordinator.data.examples import Example
from coordinator.loop.groups import RolloutGroups
from coordinator.loop.ledger import StepSamples, account
from coordinator.loop.multiturn import Episode
from coordinator.loop.pipeline import RolloutPipeline


class World:
    """Published weight versions, a data cursor, and a producer that records when it ran."""

    def __init__(self, stale_steps: tuple[int, ...] = (), fail_step: int | None = None):
        self.version, self.position, self.produced, self.resampled = 0, 0, [], []
        self.stale_steps, self.staled, self.fail_step = set(stale_steps), set(), fail_step
        self.lock = threading.Lock()

    def produce(self, step: int, num_groups: int):
        with self.lock:
            self.produced.append((step, self.version))
            version = self.version - 5 if step in self.stale_steps - self.staled else self.version
            self.staled.add(step)  # a step's first batch only
            first, self.position = self.position, self.position + num_groups
        if step == self.fail_step:
            raise RuntimeError(f"dynamic sampling exhausted at step {step}")
        return self._groups(range(first, first + num_groups), version), {"drawn": float(num_groups)}

    def resample(self, step: int, stale: RolloutGroups) -> RolloutGroups:
        with self.lock:
            self.resampled.append((step, stale.draws))
            return self._groups(stale.draws, self.version)

    @staticmethod
    def _groups(draws, version: int) -> RolloutGroups:
        groups = [[Episode("t", [1], [0.0], None, float(g), g == 1, "stop", version) for g in range(2)] for _ in draws]
        examples = [Example(f"p{d}", "a", "t", (1, 2)) for d in draws]
        rewards = torch.tensor([[0.0, 1.0]] * len(groups))
        return RolloutGroups(examples, [[1]] * len(groups), groups, rewards, rewards > 0, tuple(draws))

    def pipeline(self, max_age: int) -> RolloutPipeline:
        return RolloutPipeline(self.produce, 4, resample=self.resample, max_age=max_age,
                               trainer_version=lambda: self.version,
                               cursor_state=lambda: {"epoch": 0, "position": self.position},
                               log=structlog.get_logger())

    def train_and_publish(self, pipeline: RolloutPipeline, step: int) -> None:
        time.sleep(0.05)  # training
        self.version += 1
        pipeline.published(step)


def _run(world: World, max_age: int, steps: int = 6, first: int = 1) -> list[dict]:
    pipeline, taken = world.pipeline(max_age), []
    pipeline.start(first, steps)
    try:
        for step in range(first, steps + 1):
            batch = pipeline.take(step)
            ages = [world.version - min(e.weight_version for e in g) for g in batch.rollouts.groups]
            taken.append({"step": step, "ages": ages, "metrics": batch.metrics, "cursor": pipeline.cursor_after(step),
                          "ledger": pipeline.samples_of(step).to_json()})
            world.train_and_publish(pipeline, step)
    finally:
        pipeline.stop()
    return taken


def test_the_synchronous_pipeline_produces_each_batch_with_the_previous_steps_weights():
    world = World()
    taken = _run(world, max_age=0)
    assert world.produced == [(step, step - 1) for step in range(1, 7)]  # batch s after step s - 1 published
    assert all(t["ages"] == [0] * 4 for t in taken)
    assert [t["cursor"]["position"] for t in taken] == [4, 8, 12, 16, 20, 24]


@pytest.mark.parametrize("max_age", [1, 2])
def test_async_runs_ahead_but_never_hands_out_a_trajectory_older_than_the_bound(max_age):
    world = World()
    taken = _run(world, max_age=max_age)
    assert any(version < step - 1 for step, version in world.produced)  # it did run ahead
    assert all(step - 1 - version <= max_age for step, version in world.produced)
    assert all(max(t["ages"]) <= max_age and t["metrics"]["trajectory_age_max"] <= max_age for t in taken)
    assert [t["cursor"]["position"] for t in taken] == [4 * s for s in range(1, 7)]  # its own prompts, not later ones


def test_a_stale_group_is_dropped_and_its_prompt_sampled_again_never_trained_on():
    world = World(stale_steps=(1,))
    taken = _run(world, max_age=1, steps=2)
    first = taken[0]
    assert first["metrics"]["stale_groups_dropped"] == 4.0 and first["ages"] == [0] * 4
    assert taken[1]["metrics"]["stale_groups_dropped"] == 0.0
    assert world.resampled == [(1, (0, 1, 2, 3))]  # the same prompts, no new draw
    ledger = first["ledger"]  # the stale samples dropped with their old version, the new ones trained
    assert ledger["trained"] == [[d, [0, 0]] for d in range(4)]
    assert ledger["dropped"] == [[d, [-5, -5], "stale"] for d in range(4)]
    assert account([StepSamples.from_json(t["ledger"]) for t in taken], steps=2, groups=4, generations=2,
                   max_age=1) == []


@pytest.mark.parametrize("stale_step", [1, 2])
def test_a_resume_after_a_stale_drop_trains_no_prompt_twice(stale_step):
    """A run checkpoints after each step, dies after step 3 and resumes from step 2's checkpoint
    (its cursor). The stale groups' replacements used to be fresh prompts, drawn past the cursor
    that the next batch (already produced) and the checkpoint held: the resumed run drew them
    again, and trained them twice."""
    world = World(stale_steps=(stale_step,))
    before = _run(world, max_age=1, steps=3)
    assert sum(t["metrics"]["stale_groups_dropped"] for t in before) == 4.0
    checkpoint = before[1]
    world.position = checkpoint["cursor"]["position"]  # the resume: step 2's checkpoint's cursor
    after = _run(world, max_age=1, steps=4, first=3)
    history = [StepSamples.from_json(t["ledger"]) for t in before[:2] + after]
    assert account(history, steps=4, groups=4, generations=2, max_age=1) == []


def test_a_producer_error_is_raised_by_the_step_it_was_producing():
    world = World(fail_step=2)
    pipeline = world.pipeline(max_age=1)
    pipeline.start(1, 4)
    try:
        pipeline.take(1)
        world.train_and_publish(pipeline, 1)
        with pytest.raises(RuntimeError, match="exhausted at step 2"):
            pipeline.take(2)
        assert pipeline.take(3).step == 3  # the next take starts the pipeline anew at its step
    finally:
        pipeline.stop()


def test_a_lone_step_is_the_same_pipeline_of_one_batch():
    world = World()
    pipeline = world.pipeline(max_age=0)
    assert pipeline.take(5).step == 5 and world.produced == [(5, 0)]
    pipeline.stop()


def test_a_stop_ends_a_producer_that_waits_for_a_reward_service_that_never_comes():
    """Ctrl-C, SIGTERM or a Slurm requeue while no reward service is live: the stop must not wait
    for one (a requeued run's old coordinator once lingered, and took the new reward service's
    registration, until a service came back)."""
    from coordinator.loop.context import LoopContext
    from coordinator.loop.scoring import RewardRouter
    from reward_svc.types import ScoreItem

    ctx = LoopContext(None, None, None, None, None, structlog.get_logger(), None)
    router = RewardRouter({}, refresh=dict, sleep=ctx.pause, initial_backoff_s=0.05, max_backoff_s=0.2)
    waiting = threading.Event()

    def produce(step, num_groups):
        waiting.set()
        router.score([ScoreItem("t", "p", "c", "a")])
        raise AssertionError("scored without a reward service")

    pipeline = RolloutPipeline(produce, 4, resample=None, max_age=1, trainer_version=lambda: 0, cursor_state=dict,
                               log=structlog.get_logger(), stopping=ctx.stopping)
    pipeline.start(1, 1)
    assert waiting.wait(10)
    time.sleep(0.3)  # a few retries
    thread = pipeline._thread
    pipeline.stop(timeout_s=10)
    assert not thread.is_alive()
    assert not ctx.stopping.is_set()  # the next start waits for services again
    with pytest.raises(Exception, match="stopping"):
        ctx.stopping.set()
        ctx.pause(5)
