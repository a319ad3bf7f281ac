"""The multi-turn rollout loop against an in-process scripted generator and the calculator
environment: token layout, loss mask, placeholder logprobs, turn and length limits; and the
trainer's batching and GRPO loss treating observation tokens as absent."""

import pytest
import torch

from coordinator.loop.multiturn import OBSERVATION_LOGPROB, Episode, run_episodes
from coordinator.loop.scoring import RewardRouter, per_task_metrics
from reward_svc.envs import calculator
from reward_svc.types import StepResult
from tandem.generation.types import Completion, SamplingConfig
from trainer_svc.batching import collate, count_loss_tokens, validate_samples
from trainer_svc.losses import grpo_loss
from trainer_svc.types import GrpoLossConfig, Sample

BOS, EOS = 1, 2


class CharCodec:
    """ids = code points + 10; BOS and EOS are special (dropped by decode)."""

    def encode(self, text):
        return [ord(c) + 10 for c in text]

    def decode(self, ids):
        return "".join(chr(i - 10) for i in ids if i not in (BOS, EOS))

    def prompt(self, text):
        return [BOS, *self.encode(text)]


class ScriptedGenerator:
    """Writes `policy(context text)` + EOS for every sample; logprob of token k is -(k+1)/10."""

    def __init__(self, policy, codec):
        self.policy, self.codec, self.calls = policy, codec, []

    def __call__(self, prompts, sampling):
        self.calls.append((len(prompts), sampling.n))
        groups = []
        for p, prompt in enumerate(prompts):
            text = self.policy(self.codec.decode(prompt))
            ids = self.codec.encode(text)[: sampling.max_tokens - 1] + [EOS]
            reason = "stop" if len(self.codec.encode(text)) < sampling.max_tokens else "length"
            groups.append([Completion(p, g, tuple(ids), tuple(-(k + 1) / 10 for k in range(len(ids))), reason, 3)
                           for g in range(sampling.n)])
        return groups


class CalculatorEnv:
    """The calculator environment in-process (what the reward service's Step runs)."""

    def __init__(self, max_tool_calls=2):
        self.max_tool_calls, self.num_calls = max_tool_calls, 0

    def step(self, items):
        self.num_calls += 1
        return [calculator.step(i.prompt, i.ground_truth, i.history, i.completion, self.max_tool_calls) for i in items]


def tool_user(context):
    """Calls the tool once, then copies its answer."""
    if context.endswith("="):
        return "?"
    return context.rstrip("\n").rsplit("?", 1)[1] if context.endswith("\n") else "x"


def _run(policy, texts=(("calc", "12+34=", "46"),), n=2, max_turns=4, max_total_tokens=64, env=None):
    codec = CharCodec()
    generator = ScriptedGenerator(policy, codec)
    env = env or CalculatorEnv()
    prompts = [codec.prompt(prompt) for _, prompt, _ in texts]
    sampling = SamplingConfig(n=n, temperature=1.0, max_tokens=4, seed=5)
    groups = run_episodes(prompts, list(texts), sampling, generator, env, codec, max_turns=max_turns,
                          max_total_tokens=max_total_tokens)
    return groups, generator, env, codec


def test_tool_call_then_answer_layout_mask_and_logprobs():
    groups, generator, env, codec = _run(tool_user, texts=[("calc", "12+34=", "46"), ("calc", "50+49=", "99")])
    assert [len(g) for g in groups] == [2, 2]
    episode = groups[0][1]
    # "?" EOS | "46\n" (observation) | "46" EOS
    assert episode.token_ids == [*codec.encode("?"), EOS, *codec.encode("46\n"), *codec.encode("46"), EOS]
    assert episode.loss_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert episode.logprobs == [-0.1, -0.2, *[OBSERVATION_LOGPROB] * 3, -0.1, -0.2, -0.3]
    assert (episode.reward, episode.correct, episode.num_turns, episode.finish_reason) == (1.0, True, 2, "stop")
    assert groups[1][0].correct and codec.decode(groups[1][0].token_ids) == "?99\n99"
    # turn 1: n samples per prompt in one call; turn 2: one continuation per live episode
    assert generator.calls == [(2, 2), (4, 1)] and env.num_calls == 2


def test_direct_answer_ends_after_one_turn():
    groups, generator, _, _ = _run(lambda context: "46" if context == "12+34=" else "?")
    assert all(e.num_turns == 1 and e.correct and e.loss_mask == [1, 1, 1] for e in groups[0])
    assert len(generator.calls) == 1


def test_wrong_answer_after_tool_scores_zero():
    groups, *_ = _run(lambda context: "?" if context.endswith("=") else "47")
    assert [(e.reward, e.correct, e.num_turns) for e in groups[0]] == [(0.0, False, 2)] * 2


def test_too_many_tool_calls_end_the_episode_with_zero():
    groups, *_ = _run(lambda context: "?", env=CalculatorEnv(max_tool_calls=2), max_turns=10)
    episode = groups[0][0]
    assert (episode.num_turns, episode.reward, episode.correct, episode.finish_reason) == (3, 0.0, False, "stop")
    # the third call ends it: two observations inside, none trailing
    assert episode.loss_mask == [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]


def test_turn_limit_truncates_without_a_trailing_observation():
    groups, *_ = _run(lambda context: "?", max_turns=2)
    episode = groups[0][0]
    assert (episode.num_turns, episode.finish_reason, episode.correct) == (2, "length", False)
    assert episode.loss_mask == [1, 1, 0, 0, 0, 1, 1] and episode.loss_mask[-1] == 1


def test_length_limit_truncates():
    # prompt 7 + "?" EOS 2 + "46\n" 3 + next turn's budget 4 = 16 > 15
    groups, generator, *_ = _run(tool_user, max_total_tokens=15)
    assert all(e.finish_reason == "length" and e.num_turns == 1 and not e.correct for e in groups[0])
    assert len(generator.calls) == 1
    groups, *_ = _run(tool_user, max_total_tokens=16)
    assert all(e.correct for e in groups[0])


def test_calculator_protocol():
    assert calculator.step("12+34=", "46", (), "?", 2) == StepResult(done=False, observation="46\n")
    assert calculator.step("calc 12+34=", "46", (), " ? ", 2).observation == "46\n"
    assert calculator.step("what is =", "46", (), "?", 2).observation == "error\n"
    assert calculator.step("12+34=", "46", (), "7*(2-5)?", 2).observation == "-21\n"
    assert calculator.step("12+34=", "46", (), "2**99?", 2).observation == "error\n"
    assert calculator.step("12+34=", "46", (), "__import__('os')?", 2).observation == "error\n"
    assert calculator.step("12+34=", "46", (), "9" * 70 + "?", 2).observation == "error\n"
    assert calculator.step("12+34=", "46", (), " 46 \n", 2) == StepResult(done=True, reward=1.0, correct=True)
    with pytest.raises(ValueError):
        calculator.evaluate("True+1")


def test_router_steps_mixed_tasks_and_per_task_metrics():
    class Fixed:
        def __init__(self, done):
            self.done = done

        def step(self, items):
            return [StepResult(done=self.done, reward=float(self.done)) for _ in items]

    router = RewardRouter({"a": Fixed(True), "b": Fixed(False)})
    from reward_svc.types import StepItem
    results = router.step([StepItem(t, "", "", (), "") for t in "aba"])
    assert [r.done for r in results] == [True, False, True]
    metrics = per_task_metrics(["a", "b", "a", "b"], [1.0, 0.0, 0.5, 1.0], [True, False, False, True], [1, 2, 1, 3])
    assert metrics == {"reward_mean/a": 0.75, "accuracy_train/a": 0.5, "turns_mean/a": 1.0,
                       "reward_mean/b": 0.5, "accuracy_train/b": 0.5, "turns_mean/b": 2.5}


def _sample(prompt, episode: Episode, advantage):
    return Sample(token_ids=prompt + episode.token_ids, prompt_length=len(prompt), loss_mask=episode.loss_mask,
                  generation_logprobs=episode.logprobs, advantage=advantage)


def test_trainer_takes_episodes_and_ignores_observation_tokens():
    groups, _, _, codec = _run(tool_user)
    prompt = codec.prompt("12+34=")
    samples = [_sample(prompt, e, a) for e, a in zip(groups[0], (1.0, -1.0))]
    validate_samples(samples, vocab_size=200, need_generation_logprobs=True)
    assert count_loss_tokens(samples) == 2 * 5  # observation tokens do not count in the normaliser
    batch = collate(samples, pad_id=0, device=torch.device("cpu"))
    observation = torch.zeros_like(batch.mask, dtype=torch.bool)
    start = len(prompt) - 1 + 2  # columns of the 3 observation tokens (after "?" EOS)
    observation[:, start:start + 3] = True
    assert (batch.mask[observation] == 0).all() and batch.mask.sum() == 10

    torch.manual_seed(0)
    prev = -torch.rand_like(batch.mask) * 3
    curr0 = prev + 0.05 * torch.randn_like(prev)
    gen = torch.where(batch.mask > 0, prev + 0.02 * torch.randn_like(prev), batch.generation_logprobs)
    config = GrpoLossConfig(reference_policy_kl_penalty=0.0)

    def run(prev_logprobs):
        curr = curr0.clone().requires_grad_()
        out = grpo_loss(curr, prev_logprobs=prev_logprobs, generation_logprobs=gen, reference_logprobs=None,
                        advantages=batch.advantages, mask=batch.mask, num_global_tokens=10, config=config)
        out.loss.backward()
        return out, curr.grad

    # the trainer's own logprobs of observation tokens may be anything (an unlikely observation:
    # very negative); the loss, its gradient and every metric must not change
    base, grad = run(prev)
    far, far_grad = run(torch.where(observation, torch.full_like(prev, -60.0), prev))
    assert torch.isfinite(base.loss) and base.loss.item() == pytest.approx(far.loss.item())
    assert torch.equal(grad, far_grad) and (grad[observation] == 0).all()
    for key, value in base.metrics.items():
        assert far.metrics[key].item() == pytest.approx(value.item(), rel=1e-5), key
    assert base.metrics["token_mult_prob_error"].item() == pytest.approx(
        (torch.exp((prev - gen).abs()) * batch.mask).sum().item() / 10)
