"""The rollout gateway's logic (server.py is its HTTP transport): OpenAI chat and text
completions, each served by a live generator through `generate` (the coordinator's rollout
routing: spread over live generators, re-sent when one dies), recorded per episode
(episodes.py).

An episode is opened by `open_episode` and its token is the API key of its calls; a call
without a known, open episode's token is refused (Unauthorized, HTTP 401). `stop` strings are
applied here: the completion is cut after the first token whose text completes one (the
tokens kept are a prefix of what was sampled, so they are still exactly what the model wrote);
the returned text keeps the stop string (vLLM's include_stop_str_in_output), so the text an agent
sends back is the text of the recorded tokens. A side call (`recorded`: a judge's) is sampled the
same way but never becomes part of its episode.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from coordinator.loop.gateway.episodes import (
    ChatTokenizer,
    EpisodeMismatch,
    EpisodeRecord,
    chat_choice,
    encode,
    normalize,
    render,
)
from coordinator.loop.gateway.toolcalls import ToolSchemaError, check_tools
from tandem.generation.types import Completion, SamplingConfig

GenerateOne = Callable[[list[int], SamplingConfig], list[Completion]]
"""prompt ids and sampling -> its n completions, ordered by sample index."""


class Unauthorized(Exception):
    """No valid episode token (HTTP 401)."""


class BadRequest(ValueError):
    """A request the gateway cannot serve as sent (HTTP 400); the message says what to change."""


class GeneratorUnavailable(RuntimeError):
    """No generator could serve the call (HTTP 503). `generate` already re-sent it to the live
    ones (loop/rollout.py); this is what is left when none could."""


@dataclass(frozen=True)
class GatewayDefaults:
    """What a request that leaves sampling unset gets (the run's policy.generation)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    max_total_tokens: int = 4096
    """An episode's prompt + everything after it never exceeds this (max_tokens is cut to fit)."""
    model: str = "policy"


class RolloutGateway:
    def __init__(self, tokenizer: ChatTokenizer, generate: GenerateOne, defaults: GatewayDefaults = GatewayDefaults()):
        self.tok = tokenizer
        self.generate = generate
        self.defaults = defaults
        self._episodes: dict[str, EpisodeRecord] = {}
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()

    # ------------------------------------------------------------------ episodes

    def open_episode(self, task: str, temperature: float | None = None) -> EpisodeRecord:
        """A new episode; its token is the API key of its calls. temperature: what its calls that
        leave temperature unset get (None: the gateway's default)."""
        record = EpisodeRecord(f"ep-{secrets.token_urlsafe(18)}", task, temperature=temperature)
        with self._lock:
            self._episodes[record.token] = record
        return record

    def close_episode(self, token: str, timeout_s: float = 600.0) -> EpisodeRecord:
        """End an episode: its key stops working; a call still in flight (its agent timed out)
        finishes first, within timeout_s."""
        with self._lock:
            record = self._episodes.pop(token)
        record.closed = True
        acquired = record.busy.acquire(timeout=timeout_s)
        try:
            record.finish()
        finally:
            if acquired:
                record.busy.release()
        return record

    def _episode(self, authorization: str | None) -> EpisodeRecord:
        if not authorization or not authorization.startswith("Bearer "):
            raise Unauthorized("send the episode's token as the API key (Authorization: Bearer <episode token>); "
                               "each episode gets its own from the environment runner")
        token = authorization[len("Bearer "):].strip()
        with self._lock:
            record = self._episodes.get(token)
        if record is None or record.closed:
            raise Unauthorized("unknown or finished episode token: use the API key the environment runner gave "
                               "this episode, while the episode runs")
        return record

    # ------------------------------------------------------------------ calls

    def chat(self, authorization: str | None, body: dict) -> dict:
        record = self._episode(authorization)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        tools = body.get("tools") or None
        try:
            check_tools(tools)
        except ToolSchemaError as exc:
            raise BadRequest(str(exc)) from None
        if body.get("tool_choice") == "none":
            tools = None
        with record_lock(record), unchanged_on_failure(record):
            if recorded(body):
                try:
                    prompt = record.chat_prompt(self.tok, messages, tools)
                except (EpisodeMismatch, KeyError, ValueError) as exc:
                    raise BadRequest(str(exc)) from None
                completions = self._sample(prompt, body, record)
                choices = record.chat_choices(self.tok, completions)
            else:
                try:
                    prompt = encode(self.tok, render(self.tok, [normalize(m) for m in messages], tools,
                                                     generation=True))
                except (KeyError, ValueError) as exc:
                    raise BadRequest(str(exc)) from None
                completions = self._sample(prompt, body, record)
                choices = [chat_choice(self.tok, c, f"side_{record.side_calls}") for c in completions]
                record.side_calls += 1
        self.counters["calls"] += 1
        self.counters["malformed_tool_calls"] += sum(c.malformed for c in choices)
        out = []
        for index, choice in enumerate(choices):
            message = {"role": "assistant", "content": choice.message["content"] or None}
            if "tool_calls" in choice.message:
                message["tool_calls"] = [_openai_call(c) for c in choice.message["tool_calls"]]
            finish = "tool_calls" if "tool_calls" in choice.message else _finish(choice.completion)
            entry = {"index": index, "message": message, "finish_reason": finish,
                     "token_ids": list(choice.completion.token_ids)}
            if body.get("logprobs"):
                entry["logprobs"] = {"content": [
                    {"token": self.tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(choice.completion.token_ids, choice.completion.logprobs)]}
            out.append(entry)
        return {"id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or self.defaults.model, "choices": out,
                "prompt_token_ids": prompt, "usage": _usage(prompt, completions)}

    def completions(self, authorization: str | None, body: dict) -> dict:
        record = self._episode(authorization)
        if not recorded(body):
            raise BadRequest("side calls (tandem.record false) are chat calls: use /v1/chat/completions")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            raise BadRequest("prompt must be one string or one list of token ids")
        with record_lock(record), unchanged_on_failure(record):
            try:
                ids = record.completion_prompt(self.tok, prompt)
            except EpisodeMismatch as exc:
                raise BadRequest(str(exc)) from None
            completions = self._sample(ids, body, record)
            choices = record.completion_choices(self.tok, completions)
        self.counters["calls"] += 1
        out = []
        for index, choice in enumerate(choices):
            entry = {"index": index, "text": choice.text, "finish_reason": _finish(choice.completion),
                     "token_ids": list(choice.completion.token_ids), "logprobs": None}
            if body.get("logprobs") is not None:
                tokens = [self.tok.decode([t]) for t in choice.completion.token_ids]
                entry["logprobs"] = {"tokens": tokens, "token_logprobs": list(choice.completion.logprobs),
                                     "top_logprobs": None, "text_offset": _offsets(tokens)}
            out.append(entry)
        return {"id": f"cmpl-{secrets.token_hex(8)}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model") or self.defaults.model, "choices": out,
                "prompt_token_ids": ids, "usage": _usage(ids, completions)}

    def _sample(self, prompt: list[int], body: dict, record: EpisodeRecord) -> list[Completion]:
        d = self.defaults
        temperature = d.temperature if record.temperature is None else record.temperature
        room = d.max_total_tokens - len(prompt)
        if room < 1:
            raise BadRequest(f"the episode is out of room: its prompt is {len(prompt)} tokens and an episode holds at "
                             f"most {d.max_total_tokens} (prompt and completions together)")
        requested = body.get("max_completion_tokens") or body.get("max_tokens") or d.max_tokens
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        try:
            sampling = SamplingConfig(n=int(body.get("n") or 1), temperature=_or(body.get("temperature"), temperature),
                                      top_p=_or(body.get("top_p"), d.top_p), max_tokens=min(int(requested), room),
                                      seed=body.get("seed"))
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"sampling: {exc}") from None
        try:
            completions = self.generate(prompt, sampling)
        except Exception as exc:  # any failure of the generators is the call's, never the run's
            self.counters["generator_failures"] += 1
            raise GeneratorUnavailable(f"no generator could serve this call ({exc!r}); the episode is as it was "
                                       "before the call: send it again, or end the episode") from exc
        return [self._cut(c, stop) for c in completions] if stop else completions

    def _cut(self, completion: Completion, stop: list[str]) -> Completion:
        """The completion up to (and including) the first token that completes a stop string."""
        ids = completion.token_ids
        for end in range(1, len(ids) + 1):
            text = self.tok.decode(list(ids[:end]), skip_special_tokens=True)
            if any(s in text for s in stop):
                return replace(completion, token_ids=ids[:end], logprobs=completion.logprobs[:end],
                               finish_reason="stop")
        return completion


def recorded(body: dict) -> bool:
    """Whether a call is part of its episode: every call is, but a side call, one sent with
    `"tandem": {"record": false}` in its body (openai: extra_body), which a generator samples and
    the episode never sees (a judge's call: judge.py; its prompt is its messages alone)."""
    options = body.get("tandem")
    if options is None:
        return True
    if not isinstance(options, dict) or set(options) - {"record"} or not isinstance(options.get("record", True), bool):
        raise BadRequest('the body\'s "tandem" field takes {"record": true|false} only')
    return options.get("record", True)


@contextmanager
def record_lock(record: EpisodeRecord) -> Iterator[None]:
    """One call at a time per episode (an episode is one sequence of turns)."""
    if not record.busy.acquire(blocking=False):
        raise BadRequest("another call of this episode is in flight: an episode is one conversation, one call at a "
                         "time (open one episode per conversation)")
    try:
        yield
    finally:
        record.busy.release()


@contextmanager
def unchanged_on_failure(record: EpisodeRecord) -> Iterator[None]:
    """A call that fails (refused, or no generator) leaves its episode as it was: the agent may
    send it again, or another call."""
    saved = record.save()
    try:
        yield
    except BaseException:
        record.restore(saved)
        raise


def _or(value, default):
    return default if value is None else value


def _finish(completion: Completion) -> str:
    return "length" if completion.finish_reason == "length" else "stop"


def _openai_call(call: dict) -> dict:
    import json

    return {"id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": json.dumps(call["function"]["arguments"])}}


def _usage(prompt: list[int], completions: list[Completion]) -> dict:
    generated = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": len(prompt), "completion_tokens": generated, "total_tokens": len(prompt) + generated}


def _offsets(tokens: list[str]) -> list[int]:
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return offsets
