"""The calculator environment through a real reward_svc process on 127.0.0.1: the
coordinator's multi-turn loop (scripted in-process generator) steps episodes of several
turns over gRPC Step."""

import json

import pytest

from coordinator.loop.multiturn import run_episodes
from reward_svc.client import RewardClient
from reward_svc.types import StepItem, Turn
from tandem.generation.types import Completion, SamplingConfig
from tests import procs

pytestmark = pytest.mark.integration
BOS, EOS = 1, 2


class _Codec:
    def encode(self, text):
        return [ord(c) + 10 for c in text]

    def decode(self, ids):
        return "".join(chr(i - 10) for i in ids if i not in (BOS, EOS))


def _generator(policy, codec):
    def generate(prompts, sampling):
        return [[Completion(p, g, tuple(codec.encode(policy(codec.decode(prompt))) + [EOS]),
                            tuple([-0.5] * (len(policy(codec.decode(prompt))) + 1)), "stop", 0)
                 for g in range(sampling.n)] for p, prompt in enumerate(prompts)]
    return generate


@pytest.fixture(scope="module")
def calculator(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("calc")
    settings = workdir / "reward.json"
    settings.write_text(json.dumps({"tasks": {"calc": "calculator", "arithmetic": "exact"}, "max_tool_calls": 2}))
    service = procs.start(procs.python_module("reward_svc", "--settings", str(settings)), workdir, "reward")
    client = RewardClient(service.address, procs.TOKEN)
    yield client
    client.close()
    assert service.stop() == 0, service.log()[-2000:]


def test_info_names_the_multi_turn_tasks(calculator):
    assert calculator.info().multi_turn_tasks == ("calc",)


def test_three_turn_episodes_over_grpc(calculator):
    def policy(context):
        """Asks for the prompt's sum, then checks it explicitly, then answers."""
        if context.endswith("="):
            return "?"
        turns = context.count("\n")
        value = context.rstrip("\n").rsplit("\n", 1)[-1].rsplit("?", 1)[-1]
        return f"{value}+0?" if turns == 1 else value

    codec = _Codec()
    texts = [("calc", "12+34=", "46"), ("calc", "99+98=", "197"), ("arithmetic", "1+1=", "2")]
    prompts = [[BOS, *codec.encode(t[1])] for t in texts]
    groups = run_episodes(prompts, texts, SamplingConfig(n=2, temperature=1.0, max_tokens=8, seed=0),
                          _generator(policy, codec), calculator, codec, max_turns=5, max_total_tokens=64)
    for group, (_, prompt, answer) in zip(groups[:2], texts):
        for episode in group:
            assert (episode.num_turns, episode.reward, episode.correct) == (3, 1.0, True)
            assert codec.decode(episode.token_ids) == f"?{answer}\n{answer}+0?{answer}\n{answer}"
            observations = [t for t, m in zip(episode.token_ids, episode.loss_mask) if m == 0]
            assert codec.decode(observations) == f"{answer}\n{answer}\n"
    # the exact task through Step: one turn, scored
    assert [(e.num_turns, e.correct) for e in groups[2]] == [(1, False), (1, False)]


def test_step_answers_and_limits(calculator):
    results = calculator.step([
        StepItem("calc", "12+34=", "46", (), "?"),
        StepItem("calc", "12+34=", "46", (Turn("?", "46\n"), Turn("?", "46\n")), "?"),  # third call: over the limit
        StepItem("calc", "12+34=", "46", (), "12*(3-1)?"),
        StepItem("arithmetic", "1+1=", "2", (), "2"),
    ])
    assert [(r.done, r.observation, r.reward, r.correct) for r in results] == [
        (False, "46\n", 0.0, False), (True, "", 0.0, False), (False, "24\n", 0.0, False), (True, "", 1.0, True)]
