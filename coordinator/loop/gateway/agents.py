"""Agent episodes: the coordinator owns the rollout gateway (service.py, HTTP on cluster.host) and
the record of every episode's tokens; the agent itself runs in the task's environment service
(a reward service with `agents`: reward_svc/agents.py, RewardService.RunEpisode), which gets the
example, the gateway's base URL and the episode's API key, runs the agent against an
`openai.AsyncOpenAI` client on them, and returns the reward or the counted reason the episode
ended without one (`EpisodeEnd`: one metric per reason, agent/ended_<reason>, and the totals
agent_timeouts, agent_errors). An episode that ended without a reward keeps its model turns,
trained with reward 0; one that made no model call is empty (no_model_turns), ignored by the
trainer (loss mask 0). Nothing an agent does ends the run.

Spreading and failures (`Environments`): a task's episodes go to the live environment services of
the task, each at most `max_concurrency` at a time, the least busy first. A service that dies (or
stops answering) mid-episode costs the episode, never the run: the service is dropped from
membership, the episode's partial record is discarded and the episode is re-run from its start on
a live service (counted: agent/episodes_rerun), at most MAX_RERUNS times, then it ends as
service_lost. With no live service for the task the run waits (logged every PAUSE_LOG_PERIOD_S)
until one registers, as for a reward service (loop/scoring.py). A generator that dies during a
model call is not the agent's failure: the call's turn is re-sent to a live generator
(loop/rollout.py `generate`, the gateway's `generate`); only when none is left does the call fail
(HTTP 503, counted as no_generator).

The trainer gets a group's episodes under one prompt: the longest prefix their first calls'
prompts share (an agent may render each episode's prompt differently); the rest of each
episode's own prompt comes after it, masked out, before its first model turn.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.data.examples import Example
from coordinator.loop.gateway.episodes import EpisodeRecord
from coordinator.loop.gateway.service import RolloutGateway
from coordinator.loop.multiturn import OBSERVATION_LOGPROB, Episode
from reward_svc.config import AgentSettings
from reward_svc.types import EpisodeEnd, EpisodeRequest, EpisodeResult
from tandem.rpc import RpcFailure

MAX_RERUNS = 2
"""Times an episode is run again from its start after its environment service died under it."""
GRACE_S = 30.0
"""An episode's RunEpisode deadline is its agent's timeout_s plus this (the service ends it at
timeout_s itself; past the deadline the service counts as lost)."""
PAUSE_LOG_PERIOD_S = 30.0


class EnvironmentClient(Protocol):
    def run_episode(self, request: EpisodeRequest, timeout_s: float) -> EpisodeResult:
        """Run one agent episode to its end (reward_svc.client.RewardClient.run_episode); raises
        tandem.rpc.RpcFailure when the service fails."""


@dataclass
class AgentOutcome:
    record: EpisodeRecord
    reward: float = 0.0
    correct: bool = False
    reason: EpisodeEnd | None = None
    """None: the agent returned a reward; else why the episode ended without one."""
    info: dict = field(default_factory=dict)
    turn_rewards: tuple[float, ...] = ()
    reruns: int = 0
    """Times it was run again because its environment service was lost."""


class Environments:
    """A task's live environment services (`clients()`, looked up again each time), each given at
    most `limit` episodes at once, the least busy first."""

    def __init__(self, task: str, clients: Callable[[], list], *, on_failure: Callable[[object, Exception], None],
                 wait: Callable[[float], None], log=None, poll_s: float = 0.5):
        self.task, self._clients, self._on_failure, self._wait, self._log = task, clients, on_failure, wait, log
        self._poll_s = poll_s
        self._busy: Counter[int] = Counter()
        self._freed = threading.Condition()

    def acquire(self, limit: int):
        """A live client with a free slot: waits for a slot while every live one is full, and for a
        service while none is live (`wait`, which may raise to stop the run's waiting)."""
        started = last_log = time.monotonic()
        while True:
            with self._freed:
                live = self._clients()
                free = [c for c in live if self._busy[id(c)] < limit]
                if free:
                    client = min(free, key=lambda c: self._busy[id(c)])
                    self._busy[id(client)] += 1
                    return client
                if live:  # all busy: the next release (or a service that joins) frees one
                    self._freed.wait(self._poll_s)
                    continue
            now = time.monotonic()
            if self._log is not None and now - last_log >= PAUSE_LOG_PERIOD_S:
                last_log = now
                self._log.warning("agent_env_waiting", task=self.task, waited_s=round(now - started),
                                  message=f"no live environment service serves task {self.task!r}; the run waits "
                                          "until one registers (python -m reward_svc --settings ... --coordinator "
                                          "<this run's coordinator address>)")
            self._wait(self._poll_s)

    def release(self, client) -> None:
        with self._freed:
            self._busy[id(client)] -= 1
            self._freed.notify()

    def failed(self, client, exc: Exception) -> None:
        self._on_failure(client, exc)

    def count(self) -> int:
        return len(self._clients())


def run_agents(gateway: RolloutGateway, url: str, task: str, agent: AgentSettings, environments: Environments,
               examples: Sequence[Example], n: int, *, log=None,
               temperature: float | None = None) -> list[list[AgentOutcome]]:
    """n episodes of the task's agent per example (per example, in sample order), each run by an
    environment service; blocks until all ended. temperature: of the calls that leave it unset
    (validation: 0, greedy)."""

    def one(example: Example) -> AgentOutcome:
        request = {"prompt": example.prompt, "answer": example.answer, "task": example.task}
        for attempt in range(MAX_RERUNS + 1):
            client = environments.acquire(agent.max_concurrency)
            record = gateway.open_episode(task, temperature)
            try:
                result = client.run_episode(EpisodeRequest(task, request, url, record.token), agent.timeout_s + GRACE_S)
            except RpcFailure as exc:
                lost = gateway.close_episode(record.token)  # its partial turns are not trained: it runs again
                if not exc.status.retryable:
                    raise
                environments.failed(client, exc)
                error = str(exc)[:300]
                if log is not None:
                    log.warning("agent_episode_rerun" if attempt < MAX_RERUNS else "agent_episode_lost", task=task,
                                attempt=attempt + 1, model_turns=len(lost.turns), error=error)
                continue
            finally:
                environments.release(client)
            outcome = AgentOutcome(gateway.close_episode(record.token), reruns=attempt, info=result.info)
            if result.end is EpisodeEnd.REWARDED:
                outcome.reward, outcome.correct, outcome.turn_rewards = result.reward, result.correct, result.turn_rewards
            else:
                outcome.reason = result.end
            return outcome
        return AgentOutcome(lost, reason=EpisodeEnd.SERVICE_LOST, reruns=MAX_RERUNS,
                            info={"error": f"the environment services of task {task!r} were lost {MAX_RERUNS + 1} "
                                           f"times while running this episode (last: {error})"})

    workers = agent.max_concurrency * max(1, environments.count())
    with ThreadPoolExecutor(min(workers, n * len(examples)) or 1, thread_name_prefix=f"agents-{task}") as pool:
        futures = [[pool.submit(one, e) for _ in range(n)] for e in examples]
        return [[f.result() for f in group] for group in futures]


def outcome_metrics(groups: list[list[AgentOutcome]]) -> Counter[str]:
    """Counts of the round: episodes that ended without a reward, per reason (ended_<reason>) and
    in total (agent_timeouts; agent_errors: every other reason), episodes run again after their
    environment service was lost (episodes_rerun), those that gave per-turn rewards, episodes that ran no model call,
    the calls' malformed tool calls, turns whose template re-rendering differs from the recorded
    tokens, and side calls (a judge's: reward_svc/envs/judge.py)."""
    counts: Counter[str] = Counter()
    for o in (o for group in groups for o in group):
        counts["agent_episodes"] += 1
        counts["agent_timeouts"] += o.reason is EpisodeEnd.TIMEOUT
        counts["agent_errors"] += o.reason is not None and o.reason is not EpisodeEnd.TIMEOUT
        for reason in EpisodeEnd:
            if reason is not EpisodeEnd.REWARDED:
                counts[f"ended_{reason.value}"] += o.reason is reason
        counts["episodes_rerun"] += o.reruns > 0
        counts["turn_rewarded_episodes"] += bool(o.turn_rewards)
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
    """The run's rollout gateway (HTTP) and the agent tasks' episodes through it, run by their
    environment services (`environments(task)`: the live ones' clients)."""

    def __init__(self, gateway: RolloutGateway, server, environments: Callable[[str], list], *,
                 on_failure: Callable[[object, Exception], None] = lambda client, exc: None,
                 wait: Callable[[float], None] = time.sleep, log=None):
        self.gateway, self.server, self.log = gateway, server, log
        self._environments, self._on_failure, self._wait = environments, on_failure, wait
        self._by_task: dict[str, Environments] = {}
        self.counts: Counter[str] = Counter()

    @classmethod
    def start(cls, tokenizer, generate, defaults, environments: Callable[[str], list], *, host: str = "127.0.0.1",
              on_failure: Callable[[object, Exception], None] = lambda client, exc: None,
              wait: Callable[[float], None] = time.sleep, log=None) -> AgentRunner:
        """host: where the gateway listens (the run's cluster.host: environment services elsewhere
        reach it there)."""
        from coordinator.loop.gateway.server import GatewayServer

        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("agent tasks need the checkpoint's chat template (the gateway renders the agents' "
                             "messages with it): add chat_template to its tokenizer_config.json")
        gateway = RolloutGateway(tokenizer, generate, defaults)
        server = GatewayServer(gateway, host=host).start()
        if log is not None:
            log.info("rollout_gateway", url=server.url)
        return cls(gateway, server, environments, on_failure=on_failure, wait=wait, log=log)

    @property
    def url(self) -> str:
        """The gateway's base URL as environment services reach it (a wildcard host: this host's name)."""
        host = self.server.host
        return self.server.url if host not in ("0.0.0.0", "::") else \
            f"http://{socket.gethostname()}:{self.server.port}/v1"

    def environments(self, task: str) -> Environments:
        if task not in self._by_task:
            self._by_task[task] = Environments(task, lambda: self._environments(task), on_failure=self._on_failure,
                                               wait=self._wait, log=self.log)
        return self._by_task[task]

    def collect(self, task: str, agent: AgentSettings, examples: Sequence[Example], n: int,
                prompt_of: Callable[[Example], list[int]], version: int = 0) -> list[tuple[list[int], list[Episode]]]:
        """Per example, the (prompt, episodes) of its n agent episodes; counts go to `counts`.
        version: the weights being served (the age of an episode that made no model call)."""
        outcomes = run_agents(self.gateway, self.url, task, agent, self.environments(task), examples, n, log=self.log)
        self.counts.update(outcome_metrics(outcomes))
        return [group_episodes(group, prompt_of(example), self.gateway.tok.eos_token_id, version)
                for group, example in zip(outcomes, examples)]

    def evaluate(self, task: str, agent: AgentSettings, examples: Sequence[Example]) -> list[AgentOutcome]:
        """One greedy episode per example (validation: calls that leave temperature unset get 0)."""
        outcomes = run_agents(self.gateway, self.url, task, agent, self.environments(task), examples, 1, log=self.log,
                              temperature=0.0)
        return [group[0] for group in outcomes]

    def drain_metrics(self) -> dict[str, float]:
        """The counts since the last drain, as step metrics (agent/<name>)."""
        out = {f"agent/{k}": float(v) for k, v in self.counts.items()}
        self.counts.clear()
        return out

    def close(self) -> None:
        self.server.stop()
