"""Running agent environments: each episode is `await fn(example, client)` with an
`openai.AsyncOpenAI` client whose base URL is the rollout gateway and whose API key is the
episode's token; every model call it makes is recorded by the gateway (episodes.py).

The agents run in the coordinator process, on an asyncio loop of the rollout's thread, at most
`max_concurrency` at a time, each within `timeout_s`. An agent that raises, times out or returns
something other than a reward ends its episode with reward 0 and a counted reason (`EndReason`:
one metric per reason, agent/ended_<reason>, and the totals agent_timeouts, agent_errors); its
model turns are still trained, with that reward. An agent that made no model call gives an
empty episode (no_model_turns) that the trainer ignores (loss mask 0). Nothing an agent does
ends the run. A generator that dies during a call is not the agent's failure: the call's turn
is re-sent to a live generator (loop/rollout.py `generate`, the gateway's `generate`); only when
none is left does the call fail (HTTP 503, counted as no_generator).

The trainer gets a group's episodes under one prompt: the longest prefix their first calls'
prompts share (an agent may render each episode's prompt differently); the rest of each
episode's own prompt comes after it, masked out, before its first model turn.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.data.examples import Example
from coordinator.loop.gateway.episodes import EpisodeRecord
from coordinator.loop.gateway.judge import UnparsableJudgement
from coordinator.loop.gateway.service import RolloutGateway
from coordinator.loop.multiturn import OBSERVATION_LOGPROB, Episode


class EndReason(StrEnum):
    """Why an agent's episode ended without a reward (each is counted: agent/ended_<value>)."""

    TIMEOUT = "timeout"
    """It ran past env.<task>.agent.timeout_s."""
    ERROR = "error"
    """The agent (its own code, a tool) raised."""
    BAD_RETURN = "bad_return"
    """It returned something other than a finite number or (finite number, dict)."""
    REFUSED_CALL = "refused_call"
    """A model call of it was refused by the gateway (HTTP 4xx: a request the gateway cannot serve
    as sent, e.g. messages that do not continue the episode, or an episode out of room) and it
    did not handle the error."""
    NO_GENERATOR = "no_generator"
    """A model call of it failed because no generator could serve it (HTTP 503)."""
    JUDGE_UNPARSABLE = "judge_unparsable"
    """Its judge's reply held no score in range (judge.py UnparsableJudgement), not handled."""


class BadReturn(TypeError):
    """An agent returned something that is not a reward."""


@dataclass
class AgentOutcome:
    record: EpisodeRecord
    reward: float = 0.0
    correct: bool = False
    reason: EndReason | None = None
    """None: the agent returned a reward; else why the episode ended without one."""
    info: dict = field(default_factory=dict)


def run_agents(gateway: RolloutGateway, url: str, fn: Callable, examples: Sequence[Example], n: int, *,
               timeout_s: float, max_concurrency: int, log=None,
               temperature: float | None = None) -> list[list[AgentOutcome]]:
    """n episodes of `fn` per example (per example, in sample order); blocks until all ended.
    temperature: of the calls that leave it unset (validation: 0, greedy)."""
    return asyncio.run(_run(gateway, url, fn, examples, n, timeout_s, max_concurrency, log, temperature))


async def _run(gateway, url, fn, examples, n, timeout_s, max_concurrency, log,
               temperature) -> list[list[AgentOutcome]]:
    import openai

    limit = asyncio.Semaphore(max_concurrency)

    async def one(example: Example) -> AgentOutcome:
        async with limit:
            record = gateway.open_episode(example.task, temperature)
            outcome = AgentOutcome(record)
            client = openai.AsyncOpenAI(base_url=url, api_key=record.token, max_retries=0, timeout=timeout_s)
            try:
                result = await asyncio.wait_for(fn({"prompt": example.prompt, "answer": example.answer,
                                                    "task": example.task}, client), timeout_s)
                outcome.reward, outcome.info = _reward(result)
                outcome.correct = bool(outcome.info.get("correct", outcome.reward > 0))
            except TimeoutError:
                outcome.reason = EndReason.TIMEOUT
                outcome.info = {"error": f"the episode ran past its time limit of {timeout_s} s "
                                         "(env.<task>.agent.timeout_s)"}
            except Exception as exc:  # noqa: BLE001 (user code: any failure ends the episode, never the run)
                outcome.reason = end_reason(exc)
                outcome.info = {"error": repr(exc)}
            finally:
                if outcome.reason is not None and log is not None:
                    log.warning("agent_episode_failed", task=example.task, reason=outcome.reason.value,
                                error=outcome.info.get("error"))
                await client.close()
                await asyncio.to_thread(gateway.close_episode, record.token)
            return outcome

    tasks = [[asyncio.create_task(one(e)) for _ in range(n)] for e in examples]
    return [[await t for t in group] for group in tasks]


def _reward(result) -> tuple[float, dict]:
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        reward, info = result
    else:
        reward, info = result, {}
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        raise BadReturn(f"an agent returns a number (or (number, dict)); got {type(reward).__name__}")
    if not math.isfinite(reward):
        raise BadReturn(f"an agent returns a finite reward; got {reward}")
    return float(reward), dict(info)


def end_reason(exc: BaseException) -> EndReason:
    """The reason an agent's exception ends its episode: a model call the gateway refused or could
    not serve (the openai client's status errors, also when the agent wrapped them), else its own."""
    import openai

    if isinstance(exc, BadReturn):
        return EndReason.BAD_RETURN
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, UnparsableJudgement):
            return EndReason.JUDGE_UNPARSABLE
        if isinstance(exc, openai.APIStatusError):
            if exc.status_code == 503:
                return EndReason.NO_GENERATOR
            if 400 <= exc.status_code < 500:
                return EndReason.REFUSED_CALL
        exc = exc.__cause__ or exc.__context__
    return EndReason.ERROR


def outcome_metrics(groups: list[list[AgentOutcome]]) -> Counter[str]:
    """Counts of the round: episodes that ended without a reward, per reason (ended_<reason>) and
    in total (agent_timeouts; agent_errors: every other reason), episodes that ran no model call,
    the calls' malformed tool calls, turns whose template re-rendering differs from the recorded
    tokens, and side calls (a judge's: judge.py)."""
    counts: Counter[str] = Counter()
    for o in (o for group in groups for o in group):
        counts["agent_episodes"] += 1
        counts["agent_timeouts"] += o.reason is EndReason.TIMEOUT
        counts["agent_errors"] += o.reason is not None and o.reason is not EndReason.TIMEOUT
        for reason in EndReason:
            counts[f"ended_{reason.value}"] += o.reason is reason
        counts["no_model_turns"] += not o.record.turns
        counts["malformed_tool_calls"] += o.record.malformed_tool_calls
        counts["retokenize_mismatches"] += o.record.retokenize_mismatches
        counts["model_turns"] += len(o.record.turns)
        counts["tool_calls"] += o.record.tool_calls
        counts["side_calls"] += o.record.side_calls
    return counts


def group_episodes(outcomes: list[AgentOutcome], fallback_prompt: list[int], eos_id: int,
                   fallback_version: int = 0) -> tuple[list[int], list[Episode]]:
    """One group's (prompt, episodes) for the trainer (see the module docstring). An episode with
    no model turn gets the oldest version of the group's others (else fallback_version), so it
    never makes its group look stale."""
    prompts = [o.record.tokens[:o.record.prompt_length] for o in outcomes if o.record.turns]
    if not prompts:
        prompt = list(fallback_prompt)
    else:
        shared = len(prompts[0])
        for p in prompts[1:]:
            shared = min(shared, next((i for i, (a, b) in enumerate(zip(prompts[0], p)) if a != b), len(p)))
        if shared == 0:
            raise ValueError("the agent's episodes of one example share no first prompt token; render a group's "
                             "episodes from the same first messages (or let the chat template write a BOS token)")
        prompt = prompts[0][:shared]
    sampled = [o.record.weight_version for o in outcomes if o.record.turns]
    empty_version = min(sampled) if sampled else fallback_version
    episodes = []
    for o in outcomes:
        reward = o.reward if o.reason is None else 0.0
        correct = o.correct and o.reason is None
        if not o.record.turns:
            episodes.append(Episode(o.record.task, [eos_id], [OBSERVATION_LOGPROB], [0.0], reward, False, "abort",
                                    empty_version, 0, [], True))
            continue
        episode = o.record.to_episode(reward, correct)
        own = o.record.tokens[len(prompt):o.record.prompt_length]
        episode.token_ids = own + episode.token_ids
        episode.logprobs = [OBSERVATION_LOGPROB] * len(own) + episode.logprobs
        episode.loss_mask = [0.0] * len(own) + episode.loss_mask
        episodes.append(episode)
    return prompt, episodes


class AgentRunner:
    """The run's rollout gateway (HTTP on 127.0.0.1) and the agents' episodes through it."""

    def __init__(self, gateway: RolloutGateway, server, log=None):
        self.gateway, self.server, self.log = gateway, server, log
        self.counts: Counter[str] = Counter()

    @classmethod
    def start(cls, tokenizer, generate, defaults, log=None) -> AgentRunner:
        from coordinator.loop.gateway.server import GatewayServer

        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("agent tasks need the checkpoint's chat template (the gateway renders the agents' "
                             "messages with it): add chat_template to its tokenizer_config.json")
        gateway = RolloutGateway(tokenizer, generate, defaults)
        server = GatewayServer(gateway).start()
        if log is not None:
            log.info("rollout_gateway", url=server.url)
        return cls(gateway, server, log)

    def collect(self, agent, examples: Sequence[Example], n: int, prompt_of: Callable[[Example], list[int]],
                version: int = 0) -> list[tuple[list[int], list[Episode]]]:
        """Per example, the (prompt, episodes) of its n agent episodes; counts go to `counts`.
        version: the weights being served (the age of an episode that made no model call)."""
        outcomes = run_agents(self.gateway, self.server.url, agent.env.fn, examples, n, timeout_s=agent.timeout_s,
                              max_concurrency=agent.max_concurrency, log=self.log)
        self.counts.update(outcome_metrics(outcomes))
        return [group_episodes(group, prompt_of(example), self.gateway.tok.eos_token_id, version)
                for group, example in zip(outcomes, examples)]

    def evaluate(self, agent, examples: Sequence[Example]) -> list[AgentOutcome]:
        """One greedy episode per example (validation: calls that leave temperature unset get 0)."""
        outcomes = run_agents(self.gateway, self.server.url, agent.env.fn, examples, 1, timeout_s=agent.timeout_s,
                              max_concurrency=agent.max_concurrency, log=self.log, temperature=0.0)
        return [group[0] for group in outcomes]

    def drain_metrics(self) -> dict[str, float]:
        """The counts since the last drain, as step metrics (agent/<name>)."""
        out = {f"agent/{k}": float(v) for k, v in self.counts.items()}
        self.counts.clear()
        return out

    def close(self) -> None:
        self.server.stop()
