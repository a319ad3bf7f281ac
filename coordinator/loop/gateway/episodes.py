"""Token-in/token-out: what the gateway records of one agent episode, and how a turn's prompt
is built from the tokens of the turns before it.

An episode is one token sequence. Its first model call renders the request's messages with the
checkpoint's chat template (tools included, as the template renders them). Every later call
must continue the conversation: its messages start with the ones already covered, then the
assistant message the model returned (one of the last call's choices), then new messages.
The new prompt is the recorded tokens (the previous prompt + the sampled completion, exactly as
the generator returned them) + the tokens of the newly rendered messages only. The text the
model produced is never tokenized again.

The new messages' text comes from the template itself: the covered messages plus an assistant
message holding a marker are rendered with and without the new ones; the difference is the new
messages (and the next generation prompt), and what the template writes after the marker (the
end of an assistant turn, minus the EOS token when the model sampled it) closes the turn. Where
the template renders the whole conversation differently from the recorded tokens (it drops
thinking, changes whitespace, or the model's tokens tokenize differently as text), the recorded
tokens win and `retokenize_mismatches` counts the turn.

The trainer's view (`to_episode`): the first call's prompt, then [completion 1][new messages]
[completion 2]... with loss_mask 1 on sampled tokens and 0 elsewhere, as loop/multiturn.py lays
out an episode. The completions API works the same way on text: a later prompt must start with
the previous prompt + completion text, and only the rest is tokenized.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.loop.gateway.toolcalls import parse_tool_calls
from coordinator.loop.multiturn import OBSERVATION_LOGPROB, Episode
from tandem.generation.types import Completion

MARK = "\x00tandem-gateway-mark\x00"


class ChatTokenizer(Protocol):
    eos_token_id: int
    eos_token: str

    def apply_chat_template(self, conversation, **kwargs): ...

    def __call__(self, text: str, add_special_tokens: bool = True): ...

    def decode(self, ids, skip_special_tokens: bool = False) -> str: ...


class EpisodeMismatch(ValueError):
    """A call does not continue its episode's conversation (HTTP 400)."""


@dataclass
class Choice:
    completion: Completion
    text: str
    """The completion's text (special tokens dropped)."""
    message: dict
    """The assistant message returned for it (normalized, see `normalize`)."""
    malformed: int = 0
    """Tool calls in it that could not be parsed (it is returned as text)."""


@dataclass
class TurnRecord:
    """One model call of an episode, as the generator sampled it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    weight_version: int
    finish_reason: str


@dataclass
class EpisodeRecord:
    token: str
    task: str
    tokens: list[int] = field(default_factory=list)
    prompt_length: int = 0
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict] | None = None
    """Chat: the messages of the last call (before its assistant reply)."""
    tools: list[dict] | None = None
    text: str | None = None
    """Completions: the last call's prompt text."""
    choices: list[Choice] = field(default_factory=list)
    """The last call's choices; the one the next call continues is committed then (or choice 0 at the end)."""
    retokenize_mismatches: int = 0
    side_calls: int = 0
    """Calls served without being recorded (a judge: judge.py)."""
    malformed_tool_calls: int = 0
    tool_calls: int = 0
    """Tool calls parsed from the replies the episode continued (or its last)."""
    closed: bool = False
    temperature: float | None = None
    """The temperature of calls that leave it unset (None: the gateway's default); validation: 0."""
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held by the call in flight (one at a time)."""

    # ------------------------------------------------------------------ chat

    def chat_prompt(self, tok: ChatTokenizer, messages: Sequence[dict], tools: list[dict] | None) -> list[int]:
        """The prompt token ids of a chat call (see the module docstring); raises EpisodeMismatch."""
        norm = [normalize(m) for m in messages]
        if self.text is not None:
            raise EpisodeMismatch("this episode used /v1/completions; use one API per episode")
        if not self.choices:
            if self.turns:
                raise EpisodeMismatch("internal: an episode with turns has no pending choices")
            ids = encode(tok, render(tok, norm, tools, generation=True))
            self.tokens, self.prompt_length = list(ids), len(ids)
        else:
            covered = self.messages or []
            if [comparable(m) for m in norm[:len(covered)]] != [comparable(m) for m in covered]:
                raise EpisodeMismatch(f"the messages do not continue this episode: the first {len(covered)} must be "
                                      "the previous call's messages, unchanged")
            if len(norm) <= len(covered) or norm[len(covered)]["role"] != "assistant":
                raise EpisodeMismatch(f"message {len(covered)} must be the assistant's reply to the previous call")
            choice = self._match(comparable(norm[len(covered)]), lambda c: comparable(c.message))
            new = norm[len(covered) + 1:]
            self._commit(choice)
            suffix = _suffix_text(tok, covered, new, tools, choice)
            self._extend(encode(tok, suffix))
            full = encode(tok, render(tok, [*covered, choice.message, *new], tools, generation=True))
            if full != self.tokens:
                self.retokenize_mismatches += 1
        self.messages, self.tools, self.choices = norm, tools, []
        return list(self.tokens)

    def chat_choices(self, tok: ChatTokenizer, completions: list[Completion]) -> list[Choice]:
        """The call's choices (tool calls parsed), kept until the next call picks one."""
        self.choices = [chat_choice(tok, c, f"call_{len(self.turns)}") for c in completions]
        self.malformed_tool_calls += sum(c.malformed for c in self.choices)
        return self.choices

    # ------------------------------------------------------------ completions

    def completion_prompt(self, tok: ChatTokenizer, prompt: str | list[int]) -> list[int]:
        """The prompt token ids of a completions call: text (or ids) continuing the last call's."""
        if self.messages is not None:
            raise EpisodeMismatch("this episode used /v1/chat/completions; use one API per episode")
        if not self.choices:
            ids = list(prompt) if isinstance(prompt, list) else list(tok(prompt)["input_ids"])
            self.tokens, self.prompt_length = ids, len(ids)
        elif isinstance(prompt, list):
            choice = self._match(None, None, prompt=prompt)
            self._commit(choice)
            self._extend(prompt[len(self.tokens):])
        else:
            previous = self.text or ""
            choice = self._match(None, None, text=prompt[len(previous):]) if prompt.startswith(previous) else None
            if choice is None:
                raise EpisodeMismatch("the prompt must start with the previous call's prompt and one of its completions")
            self._commit(choice)
            rest = prompt[len(previous) + len(choice.text):]
            self._extend(encode(tok, rest))
            if list(tok(prompt)["input_ids"]) != self.tokens:
                self.retokenize_mismatches += 1
        self.text = prompt if isinstance(prompt, str) else tok.decode(prompt)
        return list(self.tokens)

    def completion_choices(self, tok: ChatTokenizer, completions: list[Completion]) -> list[Choice]:
        self.choices = [Choice(c, tok.decode(list(c.token_ids), skip_special_tokens=True), {}) for c in completions]
        return self.choices

    # ---------------------------------------------------------------- common

    def _match(self, key, key_of, *, prompt: list[int] | None = None, text: str | None = None) -> Choice:
        for choice in self.choices:
            if key is not None and key_of(choice) == key:
                return choice
            if prompt is not None and prompt[len(self.tokens):len(self.tokens) + len(choice.completion.token_ids)] \
                    == list(choice.completion.token_ids) and prompt[:len(self.tokens)] == self.tokens:
                return choice
            if text is not None and text.startswith(choice.text):
                return choice
        raise EpisodeMismatch("the assistant's reply is not one the model returned to the previous call (the gateway "
                              "trains on exactly what was sampled: send the reply back unchanged)")

    def _commit(self, choice: Choice) -> None:
        c = choice.completion
        self.tool_calls += len(choice.message.get("tool_calls", ()))
        self.turns.append(TurnRecord(list(self.tokens), list(c.token_ids), list(c.logprobs), c.weight_version,
                                     c.finish_reason))
        self.tokens += c.token_ids
        self.logprobs += c.logprobs
        self.loss_mask += [1.0] * len(c.token_ids)
        self.choices = []

    def _extend(self, ids: Sequence[int]) -> None:
        self.tokens += ids
        self.logprobs += [OBSERVATION_LOGPROB] * len(ids)
        self.loss_mask += [0.0] * len(ids)

    _STATE = ("tokens", "prompt_length", "loss_mask", "logprobs", "turns", "messages", "tools", "text", "choices",
              "retokenize_mismatches", "malformed_tool_calls", "tool_calls")

    def save(self) -> dict:
        """What a call may change, to `restore` when the call fails before sampling anything."""
        return {name: copy.copy(getattr(self, name)) for name in self._STATE}

    def restore(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def finish(self) -> None:
        """End the episode: a last call's reply that no call continued is its last turn (choice 0)."""
        if self.choices:
            self._commit(self.choices[0])
        self.closed = True

    @property
    def weight_version(self) -> int:
        """The oldest weights that sampled any of its turns (its age, for the staleness bound)."""
        return min((t.weight_version for t in self.turns), default=0)

    def to_episode(self, reward: float, correct: bool) -> Episode:
        """The trainer's view: tokens after the first prompt, model tokens in the loss. A trailing
        non-model part (an agent that ended on a tool result) is never trained on: it is dropped."""
        end = len(self.loss_mask)
        while end and self.loss_mask[end - 1] == 0.0:
            end -= 1
        after = self.tokens[self.prompt_length:self.prompt_length + end]
        return Episode(self.task, after, self.logprobs[:end], self.loss_mask[:end], reward, correct,
                       self.turns[-1].finish_reason if self.turns else "abort", self.weight_version, len(self.turns),
                       [], True)


def chat_choice(tok: ChatTokenizer, completion: Completion, id_prefix: str) -> Choice:
    """A completion as the assistant message the gateway returns (tool calls parsed)."""
    text = tok.decode(list(completion.token_ids), skip_special_tokens=True)
    parsed = parse_tool_calls(text)
    message = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [{"id": f"{id_prefix}_{completion.sample_index}_{i}", "type": "function",
                                  "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                 for i, c in enumerate(parsed.tool_calls)]
    return Choice(completion, text, message, parsed.malformed)


# ------------------------------------------------------------------ rendering

def normalize(message) -> dict:
    """A request message as a plain dict the template renders: content as text, tool call
    arguments as objects."""
    m = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    out = {"role": m["role"], "content": content or ""}
    if m.get("tool_calls"):
        calls = []
        for call in m["tool_calls"]:
            function = call.get("function", call)
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments or "{}")
            calls.append({"id": call.get("id", ""), "type": "function",
                          "function": {"name": function["name"], "arguments": arguments}})
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if m.get(key):
            out[key] = m[key]
    return out


def comparable(message: dict) -> tuple:
    """What must be equal for a message to be the same one again (ids aside)."""
    calls = tuple((c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
                  for c in message.get("tool_calls", ()))
    return message["role"], message["content"].strip(), calls


def render(tok: ChatTokenizer, messages: list[dict], tools: list[dict] | None, *, generation: bool) -> str:
    return tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation, tokenize=False)


def encode(tok: ChatTokenizer, text: str) -> list[int]:
    """Ids of template text: its special tokens are written in it, none are added."""
    return list(tok(text, add_special_tokens=False)["input_ids"]) if text else []


def _suffix_text(tok: ChatTokenizer, covered: list[dict], new: list[dict], tools, choice: Choice) -> str:
    """The text after the model's reply: the end of its turn as the template writes it, the new
    messages and the next generation prompt."""
    marked = [*covered, {"role": "assistant", "content": MARK}]
    before = render(tok, marked, tools, generation=False)
    after = render(tok, [*marked, *new], tools, generation=True)
    if not after.startswith(before) or MARK not in before:
        raise EpisodeMismatch("the chat template renders the earlier messages differently once new ones follow, so "
                              "the new messages cannot be appended to the recorded tokens")
    tail = before[before.rindex(MARK) + len(MARK):]
    ids = choice.completion.token_ids
    if ids and ids[-1] == tok.eos_token_id and tail.startswith(tok.eos_token):
        tail = tail[len(tok.eos_token):]  # the model sampled the end of its turn itself
    return tail + after[len(before):]
