"""The rollout gateway over real HTTP (FastAPI/uvicorn on 127.0.0.1, the `openai` client) with a
scripted generator: episode keys (401), tool schemas, Hermes tool calls, and token-in/token-out
(the next prompt holds the sampled tokens, not a re-tokenization of their text)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from coordinator.config import load_config
from coordinator.config.loading import ConfigError
from coordinator.data.examples import Example
from coordinator.embedded.tiny_chat import build_chat_tokenizer
from coordinator.loop.gateway.agents import Environments, group_episodes, outcome_metrics
from coordinator.loop.gateway.agents import run_agents as run_in_services
from coordinator.loop.gateway.server import GatewayServer
from coordinator.loop.gateway.service import GatewayDefaults, RolloutGateway
from coordinator.loop.gateway.toolcalls import parse_tool_calls
from reward_svc.agents import EpisodeRunner
from reward_svc.config import AgentSettings
from reward_svc.types import EpisodeEnd
from tandem.generation.types import Completion

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tok():
    return build_chat_tokenizer()


def chars(tok, text: str) -> list[int]:
    """`text` as the model may sample it: one token per character (never the tag tokens)."""
    return [tok.convert_tokens_to_ids(c if c != " " else " ") for c in text]


class Scripted:
    """A generator that answers each call with the next scripted token ids (+EOS); records prompts."""

    def __init__(self, tok, replies: list[list[int]]):
        self.tok, self.replies, self.prompts, self.sampled, self.temperatures = tok, list(replies), [], [], []

    def __call__(self, prompt, sampling):
        self.prompts.append(list(prompt))
        self.temperatures.append(sampling.temperature)
        out = []
        for j in range(sampling.n):
            ids = tuple(self.replies.pop(0)) + (self.tok.eos_token_id,)
            out.append(Completion(0, j, ids, tuple(-(k + 1) / 8 for k in range(len(ids))), "stop", 7))
            self.sampled.append(list(ids))
        return out


@pytest.fixture
def served(tok):
    def make(replies):
        generator = Scripted(tok, replies)
        gateway = RolloutGateway(tok, generator, GatewayDefaults(max_tokens=40, max_total_tokens=400))
        server = GatewayServer(gateway).start()
        made.append(server)
        return gateway, server, generator
    made = []
    yield make
    for server in made:
        server.stop()


def client(server, key):
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0)


def test_a_call_without_a_valid_episode_key_is_refused_with_401(served):
    gateway, server, _ = served([[5]])
    for key in ("not-an-episode", "ep-forged"):
        with pytest.raises(openai.AuthenticationError, match="episode token"):
            client(server, key).chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    import httpx
    response = httpx.post(f"{server.url}/chat/completions", json={"messages": [{"role": "user", "content": "1"}]})
    assert response.status_code == 401 and "Authorization: Bearer" in response.json()["error"]["message"]
    record = gateway.open_episode("t")
    gateway.close_episode(record.token)
    with pytest.raises(openai.AuthenticationError):  # a finished episode's key no longer works
        client(server, record.token).completions.create(model="m", prompt="1")


def test_a_tool_whose_parameters_are_not_json_schema_is_a_400_naming_it(served):
    gateway, server, generator = served([[5]])
    bad = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "objekt"}}}]
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\] \(calc\).*not a valid JSON schema"):
        client(server, gateway.open_episode("t").token).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "1"}], tools=bad)
    assert generator.prompts == []


def test_tool_calls_round_trip_with_the_sampled_tokens_not_a_retokenization(served, tok):
    call_text = '<tool_call>{"name": "calc", "arguments": {"x": 7}}</tool_call>'
    gateway, server, generator = served([chars(tok, call_text), chars(tok, "49")])
    record = gateway.open_episode("t")
    api = client(server, record.token)
    messages = [{"role": "user", "content": "7*7"}]
    first = api.chat.completions.create(model="m", messages=messages, tools=TOOLS, logprobs=True)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("calc", {"x": 7})
    assert len(choice.logprobs.content) == len(generator.sampled[0])
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "49"}]
    second = api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "49"

    first_prompt, second_prompt = generator.prompts
    assert second_prompt[:len(first_prompt)] == first_prompt
    sampled = generator.sampled[0]
    assert second_prompt[len(first_prompt):len(first_prompt) + len(sampled)] == sampled  # token for token
    assert tok.decode(second_prompt[len(first_prompt) + len(sampled):]) == "\nT:49\nA:"
    # naive re-tokenization differs: the model's text re-tokenizes into other tokens (the tag is one
    # token, the model wrote it character by character), and the template re-renders the call
    # (tojson sorts its keys); the gateway kept the sampled tokens and counted the turn
    assert tok(tok.decode(sampled, skip_special_tokens=True), add_special_tokens=False)["input_ids"] != sampled[:-1]
    messages[1]["tool_calls"][0]["function"]["arguments"] = {"x": 7}
    naive = tok(tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False)["input_ids"]
    assert naive != second_prompt and len(naive) < len(second_prompt)
    assert record.retokenize_mismatches == 1

    gateway.close_episode(record.token)
    episode = record.to_episode(1.0, True)
    assert first_prompt + episode.token_ids == second_prompt + generator.sampled[1]
    model_tokens = [t for t, m in zip(episode.token_ids, episode.loss_mask) if m == 1.0]
    assert model_tokens == generator.sampled[0] + generator.sampled[1]
    assert [lp for lp, m in zip(episode.logprobs, episode.loss_mask) if m == 1.0][:2] == [-0.125, -0.25]
    assert (episode.num_turns, episode.weight_version, episode.loss_mask[-1]) == (2, 7, 1.0)


def test_a_malformed_tool_call_is_returned_as_text_and_counted(served, tok):
    gateway, server, _ = served([chars(tok, '<tool_call>{"name": calc}</tool_call>')])
    api = client(server, gateway.open_episode("t").token)
    reply = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}], tools=TOOLS)
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == '<tool_call>{"name": calc}</tool_call>'
    assert gateway.counters["malformed_tool_calls"] == 1


def test_an_edited_reply_or_a_rewritten_history_is_a_clear_400(served, tok):
    gateway, server, _ = served([chars(tok, "12"), chars(tok, "3")])
    api = client(server, gateway.open_episode("t").token)
    api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    with pytest.raises(openai.BadRequestError, match="not one the model returned"):
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"},
                                                         {"role": "assistant", "content": "13"},
                                                         {"role": "user", "content": "2"}])
    with pytest.raises(openai.BadRequestError, match="do not continue this episode"):
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "9"},
                                                         {"role": "assistant", "content": "12"}])


def test_completions_continue_from_the_recorded_tokens_and_stop_strings_cut(served, tok):
    gateway, server, generator = served([chars(tok, "ab?cd"), chars(tok, "x")])
    record = gateway.open_episode("t")
    api = client(server, record.token)
    first = api.completions.create(model="m", prompt="q:", stop=["?"], logprobs=1)
    assert (first.choices[0].text, first.choices[0].finish_reason) == ("ab?", "stop")
    assert first.choices[0].logprobs.token_logprobs == [-0.125, -0.25, -0.375]
    api.completions.create(model="m", prompt="q:ab? then")
    first_prompt, second_prompt = generator.prompts
    assert second_prompt == first_prompt + chars(tok, "ab?") + chars(tok, " then")


def test_parser_cases():
    ok = parse_tool_calls('hi <tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert ok.content == "hi" and ok.tool_calls[0].name == "f" and json.loads(ok.tool_calls[0].arguments) == {"a": 1}
    assert parse_tool_calls("<tool_call>{\"name\": \"f\"").malformed == 1  # never closed
    assert parse_tool_calls('<tool_call>["f"]</tool_call>').malformed == 1
    assert parse_tool_calls("plain").tool_calls == ()


class InProcessEnvironment:
    """An environment service's agents (reward_svc/agents.py), called in this process: RunEpisode's
    face without gRPC (tests/unit/reward_svc/test_agent_runner.py runs it over gRPC)."""

    def __init__(self, agents: dict[str, AgentSettings]):
        import structlog

        self.agents = EpisodeRunner(agents, structlog.get_logger())

    def run_episode(self, request, timeout_s):
        return asyncio.run(self.agents.run(request))


def run_agents(gateway, url, fn, examples, n, *, timeout_s, max_concurrency, temperature=None):
    """n episodes of `fn` (a function of this module) per example, each run by an in-process
    environment service, through the gateway at url."""
    import time

    agent = AgentSettings(function=f"{__name__}.{fn.__name__}", timeout_s=timeout_s, max_concurrency=max_concurrency)
    env = InProcessEnvironment({"agent": agent})
    environments = Environments("agent", lambda: [env], on_failure=lambda c, e: None, wait=time.sleep)
    try:
        return run_in_services(gateway, url, "agent", agent, environments, examples, n, temperature=temperature)
    finally:
        env.agents.close()


def _examples(n):
    return [Example(f"{i}+1", str(i + 1), "agent", (1,)) for i in range(n)]


async def good(example, client):
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": example["prompt"]}])
    return float(reply.choices[0].message.content == example["answer"])


async def slow(example, client):
    await asyncio.sleep(5)


async def broken(example, client):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    raise RuntimeError("tool crashed")


def test_agents_that_raise_or_time_out_end_their_episode_with_a_counted_reason(served, tok):
    gateway, server, _ = served([chars(tok, "1"), chars(tok, "x"), chars(tok, "z")])
    outcomes = run_agents(gateway, server.url, good, _examples(1), 2, timeout_s=5, max_concurrency=2)
    assert sorted(o.reward for o in outcomes[0]) == [0.0, 1.0]  # the calls met the script in either order
    failed = run_agents(gateway, server.url, slow, _examples(1), 1, timeout_s=0.2, max_concurrency=1)
    failed += run_agents(gateway, server.url, broken, _examples(1), 1, timeout_s=5, max_concurrency=1)
    counts = outcome_metrics(failed)
    assert (counts["agent_timeouts"], counts["agent_errors"], counts["no_model_turns"]) == (1, 1, 1)
    prompt, episodes = group_episodes(outcomes[0] + failed[1], [1, 2], tok.eos_token_id, 99)
    assert prompt == tok("U:0+1\nA:")["input_ids"][:1] + chars(tok, "U:")  # the shared prefix
    assert sorted(e.reward for e in episodes) == [0.0, 0.0, 1.0]
    assert all(e.loss_mask[-1] == 1.0 for e in episodes)
    assert [e.weight_version for e in episodes] == [7, 7, 7]  # the empty one takes its group's age
    _, (empty,) = group_episodes(failed[0], [1, 2], tok.eos_token_id, 99)
    assert (empty.token_ids, empty.loss_mask, empty.weight_version) == ([tok.eos_token_id], [0.0], 99)


def test_an_agent_path_that_does_not_import_is_a_config_error():
    with pytest.raises(ConfigError, match="module 'no_such_pkg.agents' does not import"):
        load_config(raw={"env": {"arithmetic": {"agent": {"function": "no_such_pkg.agents.episode"}}}})
    with pytest.raises(ConfigError, match="must be an async function"):
        load_config(raw={"env": {"arithmetic": {"agent": {"function": "json.dumps"}}}})
    cfg = load_config(raw={"env": {"arithmetic": {"agent": {"function": f"{__name__}.good", "timeout_s": 3}}}})
    assert cfg.env["arithmetic"].agent.load() is good
    assert cfg.service_plan.reward_tasks == ("arithmetic",)  # its environment service runs the agent
    from coordinator.launch.specs import reward_settings

    settings = reward_settings(cfg, "arithmetic")
    assert (settings.tasks, settings.all_tasks, settings.agents["arithmetic"].timeout_s) == ({}, ["arithmetic"], 3)
    # external: the service someone else runs imports it (and refuses to start if it cannot)
    external = load_config(raw={"env": {"arithmetic": {"external": True,
                                                       "agent": {"function": "no_such_pkg.agents.episode"}}}})
    with pytest.raises(ValueError, match="agents.arithmetic: .* does not import"):
        reward_settings(external, "arithmetic")


def test_with_n_choices_the_next_call_continues_the_one_sent_back(served, tok):
    gateway, server, generator = served([chars(tok, "11"), chars(tok, "22"), chars(tok, "3")])
    record = gateway.open_episode("t")
    api = client(server, record.token)
    messages = [{"role": "user", "content": "1"}]
    first = api.chat.completions.create(model="m", messages=messages, n=2)
    assert [c.message.content for c in first.choices] == ["11", "22"]
    messages += [first.choices[1].message.model_dump(exclude_none=True), {"role": "user", "content": "2"}]
    api.chat.completions.create(model="m", messages=messages)
    first_prompt, second_prompt = generator.prompts
    assert second_prompt[len(first_prompt):len(first_prompt) + 3] == generator.sampled[1]  # choice 1's tokens
    gateway.close_episode(record.token)
    assert [t.completion_ids for t in record.turns] == [generator.sampled[1], generator.sampled[2]]


def test_a_second_call_while_one_is_in_flight_is_refused(served, tok):
    import threading

    gateway, server, _ = served([chars(tok, "1")])
    release = threading.Event()
    inner = gateway.generate

    def slow(prompt, sampling):
        release.wait(10)
        return inner(prompt, sampling)

    gateway.generate = slow
    record = gateway.open_episode("t")
    api = client(server, record.token)
    results = []
    worker = threading.Thread(target=lambda: results.append(
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])))
    worker.start()
    deadline = 100
    while not record.busy.locked() and deadline:
        deadline -= 1
        threading.Event().wait(0.05)
    with pytest.raises(openai.BadRequestError, match="one call at a time"):
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    release.set()
    worker.join(10)
    assert results and results[0].choices[0].message.content == "1"


@pytest.mark.parametrize("context", ["loop", "eval"])
def test_validation_runs_agent_tasks_greedily_through_the_gateway(served, tok, context):
    """context: a loop context's fields, or `tandem eval`'s EvalContext (which once lacked the cfg that validate reads)."""
    from types import SimpleNamespace

    from coordinator.loop.evaluation import validate
    from coordinator.loop.gateway.agents import AgentRunner
    from coordinator.run.eval_run import EvalContext

    gateway, server, generator = served([chars(tok, "1"), chars(tok, "3")])
    cfg = load_config(raw={"env": {"arithmetic": {"agent": {"function": f"{__name__}.good", "max_concurrency": 1}}}})
    env = InProcessEnvironment({"arithmetic": cfg.env["arithmetic"].agent})
    runner = AgentRunner(gateway, server, lambda task: [env])
    ctx = (SimpleNamespace(cfg=cfg, agents=runner) if context == "loop"
           else EvalContext(cfg, services=None, tokens=None, log=None, agents=runner))
    samples = []
    result = validate(ctx, [Example("0+1", "1", "arithmetic", (1,)), Example("1+1", "2", "arithmetic", (1,))], 4,
                      samples=samples)
    assert result == {"accuracy": 0.5, "reward_mean": 0.5, "num_samples": 2.0}
    assert generator.temperatures == [0.0, 0.0]  # the agent left temperature unset: greedy
    assert [s["correct"] for s in samples] == [True, False]


# ---------------------------------------------------------------------- failures (issue item 7)

async def returns_text(example, client):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    return "1.0"


async def returns_nan(example, client):
    return float("nan")


async def rewrites_history(example, client):
    messages = [{"role": "user", "content": "1"}]
    reply = await client.chat.completions.create(model="m", messages=messages)
    edited = {"role": "assistant", "content": reply.choices[0].message.content + "!"}
    await client.chat.completions.create(model="m", messages=[*messages, edited, {"role": "user", "content": "2"}])
    return 1.0


async def wraps_a_failed_call(example, client):
    try:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    except openai.APIError as exc:
        raise RuntimeError("my tool loop gave up") from exc
    return 1.0


def test_each_way_an_agent_fails_is_its_own_counted_reason_and_never_raises(served, tok):
    gateway, server, _ = served([chars(tok, "1")] * 3)
    outcomes = [run_agents(gateway, server.url, fn, _examples(1), 1, timeout_s=5, max_concurrency=1)[0][0]
                for fn in (returns_text, rewrites_history, returns_nan)]
    gateway.generate = lambda prompt, sampling: (_ for _ in ()).throw(RuntimeError("no live generator"))
    outcomes.append(run_agents(gateway, server.url, wraps_a_failed_call, _examples(1), 1, timeout_s=5,
                               max_concurrency=1)[0][0])
    assert [o.reason for o in outcomes] == [EpisodeEnd.BAD_RETURN, EpisodeEnd.REFUSED_CALL, EpisodeEnd.BAD_RETURN,
                                            EpisodeEnd.NO_GENERATOR]
    assert "returns a number" in outcomes[0].info["error"] and "not one the model returned" in outcomes[1].info["error"]
    assert "finite numbers as a reward; got nan" in outcomes[2].info["error"]  # a NaN would poison its group's advantages
    assert [o.reward for o in outcomes] == [0.0] * 4 and [len(o.record.turns) for o in outcomes] == [1, 1, 0, 0]
    counts = outcome_metrics([outcomes])
    assert (counts["ended_bad_return"], counts["ended_refused_call"], counts["ended_no_generator"],
            counts["ended_timeout"], counts["ended_error"]) == (2, 1, 1, 0, 0)
    assert (counts["agent_errors"], counts["agent_timeouts"]) == (4, 0)
    assert gateway.counters["generator_failures"] == 1


def test_a_call_no_generator_could_serve_is_a_503_and_can_be_sent_again(served, tok):
    gateway, server, generator = served([chars(tok, "1"), chars(tok, "2")])
    record = gateway.open_episode("t")
    api = client(server, record.token)
    messages = [{"role": "user", "content": "1"}]
    first = api.chat.completions.create(model="m", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "2"}]
    gateway.generate = lambda prompt, sampling: (_ for _ in ()).throw(RuntimeError("no live generator"))
    with pytest.raises(openai.InternalServerError, match="no generator could serve this call") as failed:
        api.chat.completions.create(model="m", messages=messages)
    assert failed.value.status_code == 503
    gateway.generate = generator  # a generator is back: the same call again continues the episode
    second = api.chat.completions.create(model="m", messages=messages)
    assert second.choices[0].message.content == "2"
    gateway.close_episode(record.token)
    assert [t.completion_ids for t in record.turns] == generator.sampled
    assert generator.prompts[1][:len(generator.prompts[0]) + 2] == generator.prompts[0] + generator.sampled[0]


class DyingGenerator:
    """A generator client (GeneratorClient's generate) that streams `ids` + EOS per sample, or dies
    (UNAVAILABLE) before its first completion."""

    def __init__(self, ids, dies=False):
        self.ids, self.dies, self.calls = tuple(ids), dies, 0

    def generate(self, prompts, sampling, request_id="", timeout_s=0):
        self.calls += 1
        if self.dies:
            from tandem.rpc import RpcFailure, Status
            raise RpcFailure(Status.UNAVAILABLE, "generator process killed")
        for i, _ in enumerate(prompts):
            for j in range(sampling.n):
                yield Completion(i, j, self.ids, tuple(-0.5 for _ in self.ids), "stop", 3)

    def close(self):
        pass


def test_a_generator_dying_mid_call_has_the_turn_resent_through_rollout_failover(served, tok):
    """The gateway's generate is rollout.generate (as loop/rollouts.py agent_runner wires it): the
    call whose generator dies is re-sent to a live one, and the agent never sees the failure."""
    import structlog

    from coordinator.loop import rollout
    from coordinator.membership.services import GeneratorHandle

    eos = tok.eos_token_id
    good, dying = DyingGenerator([*chars(tok, "1"), eos]), DyingGenerator([*chars(tok, "9"), eos], dies=True)
    live = [GeneratorHandle("good", good, 4), GeneratorHandle("dying", dying, 4)]  # one prompt goes to the last
    failed = []

    def on_failure(handle, exc):
        failed.append(handle.member_id)
        live.remove(handle)

    gateway, server, _ = served([])
    gateway.generate = lambda prompt, sampling: rollout.generate([prompt], sampling, lambda: list(live), on_failure,
                                                                 structlog.get_logger(), poll_s=0.05)[0]
    outcomes = run_agents(gateway, server.url, good_agent_for_1, _examples(1), 1, timeout_s=10, max_concurrency=1)
    (outcome,) = outcomes[0]
    assert (outcome.reason, outcome.reward) == (None, 1.0)
    assert failed == ["dying"] and (dying.calls, good.calls) == (1, 1)
    assert [t.completion_ids for t in outcome.record.turns] == [[*chars(tok, "1"), eos]]
    assert outcome_metrics(outcomes)["agent_errors"] == 0


async def good_agent_for_1(example, client):
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "0+1"}])
    return float(reply.choices[0].message.content == "1")


# ---------------------------------------------------------------------- LLM-as-judge (issue item 6)

JUDGE_TEMPLATE = "Q:{question} A:{answer} R:{reference}"


async def judged(example, client):
    from reward_svc.envs.judge import Judge

    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": example["prompt"]}])
    answer = reply.choices[0].message.content
    return await Judge(JUDGE_TEMPLATE, max_score=10).score(client, example["prompt"], answer, example["answer"])


def test_a_judge_is_a_side_call_the_episode_never_records(served, tok):
    gateway, server, generator = served([chars(tok, "1"), chars(tok, "Score: 8"), chars(tok, "2"), chars(tok, "fine")])
    outcomes = run_agents(gateway, server.url, judged, _examples(1), 1, timeout_s=5, max_concurrency=1)
    outcomes += run_agents(gateway, server.url, judged, _examples(1), 1, timeout_s=5, max_concurrency=1)
    (good,), (bad,) = outcomes
    assert (good.reason, good.reward) == (None, 0.8)
    assert generator.temperatures[1] == 0.0  # the judge samples greedily
    assert generator.prompts[1] == tok(tok.apply_chat_template(  # the judge's prompt is its own message alone
        [{"role": "user", "content": "Q:0+1 A:1 R:1"}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False)["input_ids"]
    assert [t.completion_ids for t in good.record.turns] == [generator.sampled[0]]  # only the policy's answer
    assert good.record.tokens == generator.prompts[0] + generator.sampled[0]
    assert bad.reason is EpisodeEnd.JUDGE_UNPARSABLE and "has no score" in bad.info["error"]
    counts = outcome_metrics(outcomes)
    assert (counts["side_calls"], counts["ended_judge_unparsable"], counts["model_turns"]) == (2, 1, 2)


def test_a_malformed_tandem_field_is_a_clear_400(served, tok):
    gateway, server, _ = served([])
    api = client(server, gateway.open_episode("t").token)
    with pytest.raises(openai.BadRequestError, match='takes {"record": true|false} only'):
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}],
                                    extra_body={"tandem": {"record": "no"}})
    with pytest.raises(openai.BadRequestError, match="side calls .* are chat calls"):
        api.completions.create(model="m", prompt="1", extra_body={"tandem": {"record": False}})
