"""Multi-turn rollouts: generate, let the environment step, append its observation as
tokens, and go on until the environment says the episode is done or a limit is reached.

One episode per sample. Turn 1 samples n completions per prompt in one generator call (so a
group shares a weight version, as in single-turn rollouts); later turns continue each live
episode from its whole token history (n=1 per episode). After every turn the reward
services' Step (reward_svc RewardService.Step) reads the conversation so far and answers with
an observation or ends the episode with a reward. An episode also ends, truncated, when it
has had `max_turns` model turns or when its next turn could overflow `max_total_tokens`
(prompt + everything after it): it keeps the rewards of its turns so far and is not correct.

Token layout of an Episode (what the trainer gets, after the prompt):
    [turn 1 tokens][observation 1 tokens][turn 2 tokens] ... [turn k tokens]
Every model turn keeps the tokens the generator sampled (EOS included when it stopped), so
the trainer scores exactly what was sampled; observations are tokenised without special
tokens. loss_mask is 1 on model tokens and 0 on observation tokens; logprobs hold the
generator's logprob on model tokens and OBSERVATION_LOGPROB on observation tokens, a
placeholder the loss never uses (masked out). A trailing observation is never kept: an
episode ends on a model turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from reward_svc.types import ScoreResult, StepItem, StepResult, Turn
from tandem.generation.types import Completion, SamplingConfig

OBSERVATION_LOGPROB = 0.0
"""Placeholder generation logprob of observation tokens (their loss_mask is 0)."""

Generate = Callable[[list[list[int]], SamplingConfig], list[list[Completion]]]
"""prompts (token ids) and sampling -> per prompt, its n completions (coordinator.rollout.generate)."""


class StepEnv(Protocol):
    def step(self, items: list[StepItem]) -> list[StepResult]:
        """One result per item, in order (RewardRouter.step, RewardClient.step)."""


class TokenCodec(Protocol):
    def encode(self, text: str) -> list[int]:
        """Token ids of text, without special tokens."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens dropped."""


@dataclass
class Episode:
    """One sample's rollout as the trainer sees it (see the module docstring for the layout).

    token_ids, logprobs and loss_mask have one entry per token after the prompt; loss_mask None
    means every token is the model's (a single-turn episode). reward is the sum of the turns'
    rewards. finish_reason is the last model turn's ("stop", "length", "abort"), or "length"
    when a turn or length limit ended the episode. weight_version: the oldest weights that
    sampled any of its turns. routed_experts: the last model turn's (MoE router replay; flat
    [position, layer, k]): its prompt was the whole episode before it, so they cover every fed
    position; empty when the generators do not return routes.
    """

    task: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[float] | None = None
    reward: float = 0.0
    correct: bool = False
    finish_reason: str = "stop"
    weight_version: int = 0
    num_turns: int = 0
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    routed_experts: tuple[int, ...] = ()

    @classmethod
    def single_turn(cls, task: str, completion: Completion, result: ScoreResult) -> Episode:
        return cls(task, list(completion.token_ids), list(completion.logprobs), None, result.reward, result.correct,
                   completion.finish_reason, completion.weight_version, 1, [], True, completion.routed_experts)

    def add_turn(self, completion: Completion) -> None:
        self.weight_version = completion.weight_version if self.num_turns == 0 else min(
            self.weight_version, completion.weight_version)
        self.num_turns += 1
        self.token_ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.loss_mask = (self.loss_mask or []) + [1.0] * len(completion.token_ids)
        self.finish_reason = completion.finish_reason
        self.routed_experts = completion.routed_experts

    def add_observation(self, observation_ids: list[int]) -> None:
        assert self.loss_mask is not None, "an observation follows a model turn"
        self.token_ids += observation_ids
        self.logprobs += [OBSERVATION_LOGPROB] * len(observation_ids)
        self.loss_mask += [0.0] * len(observation_ids)


def run_episodes(prompts: list[list[int]], texts: list[tuple[str, str, str]], sampling: SamplingConfig,
                 generate: Generate, env: StepEnv, codec: TokenCodec, *, max_turns: int,
                 max_total_tokens: int) -> list[list[Episode]]:
    """Roll out sampling.n episodes per prompt; texts[i] = (task, prompt text, ground truth)
    of prompts[i]. Returns per prompt its n finished episodes, ordered by sample index."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    groups = [[Episode(task) for _ in range(sampling.n)] for task, _, _ in texts]
    live = [(p, g) for p in range(len(prompts)) for g in range(sampling.n)]
    first = generate(prompts, sampling)
    completions = {(p, g): first[p][g] for p, g in live}
    for turn in range(1, max_turns + 1):
        items = []
        for p, g in live:
            episode, completion = groups[p][g], completions[(p, g)]
            episode.add_turn(completion)
            task, prompt_text, truth = texts[p]
            items.append(StepItem(task, prompt_text, truth, tuple(episode.turns), codec.decode(completion.token_ids)))
        results = env.step(items) if items else []
        still_live = []
        for (p, g), item, result in zip(live, items, results):
            episode = groups[p][g]
            episode.reward += result.reward
            if result.done:
                episode.done, episode.correct = True, result.correct
                continue
            observation_ids = codec.encode(result.observation)
            length = len(prompts[p]) + len(episode.token_ids) + len(observation_ids) + sampling.max_tokens
            if turn == max_turns or length > max_total_tokens:
                episode.done, episode.finish_reason = True, "length"  # truncated: no trailing observation
                continue
            episode.add_observation(observation_ids)
            episode.turns.append(Turn(item.completion, result.observation))
            still_live.append((p, g))
        live = still_live
        if not live:
            break
        continued = [prompts[p] + groups[p][g].token_ids for p, g in live]
        seed = None if sampling.seed is None else sampling.seed + turn * 1_000_003
        next_turn = generate(continued, replace(sampling, n=1, seed=seed))
        completions = {key: group[0] for key, group in zip(live, next_turn)}
    assert not live and all(e.done for group in groups for e in group)
    return groups


def multi_turn_tasks(env_config: dict) -> set[str]:
    """The tasks of `env.*` whose scorer is a multi-turn environment."""
    return {task for task, env in env_config.items() if env.scorer.multi_turn}
