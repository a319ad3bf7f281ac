"""How a dataset row's prompt becomes what the policy sees: its text (what reward services are
given) and its token ids (what generators and the trainer are given), fixed once when the
dataset is read.

A prompt is a string or a list of chat messages (`{"role": ..., "content": ...}`, in the row's
`data.messages_key`). `data.prompt_format` picks, at config load, one of:

- `RawPrompts`: the string as it is (after `data.prompt_file`'s template), tokenized with the
  tokenizer's special tokens (its BOS);
- `ChatPrompts`: messages (a string becomes one user message) rendered by the tokenizer's
  chat template with the generation prompt (`apply_chat_template(..., add_generation_prompt=True)`),
  `data.system_prompt_file` first unless the messages start with a system message; the
  template writes any BOS itself, so the text is tokenized without special tokens;
- `auto` (the default): messages through ChatPrompts, strings through RawPrompts unless a
  system prompt is set (the TRL rule: conversational rows are templated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from coordinator.config.data import DataConfig
from coordinator.data.tokens import Tokens

Prompt = str | Sequence[Mapping[str, str]]


class PromptFormat(Protocol):
    def render(self, prompt: Prompt) -> tuple[str, list[int]]:
        """(the text, its token ids) of a row's prompt; ValueError for one this format cannot take."""
        ...


@dataclass(frozen=True)
class RawPrompts:
    tokens: Tokens
    template: str = "{}"

    def render(self, prompt: Prompt) -> tuple[str, list[int]]:
        if not isinstance(prompt, str):
            raise ValueError("the prompt is a list of messages but data.prompt_format is raw: set it to chat or auto")
        text = self.template.format(prompt)
        return text, self.tokens.prompt(text)


@dataclass(frozen=True)
class ChatPrompts:
    tokens: Tokens
    system_prompt: str | None = None
    template: str = "{}"

    def render(self, prompt: Prompt) -> tuple[str, list[int]]:
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": self.template.format(prompt)}]
        else:
            messages = [_message(m) for m in prompt]
            if not messages:
                raise ValueError("the prompt is an empty list of messages")
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        text = self.tokens.chat_text(messages)
        return text, self.tokens.encode(text)


@dataclass(frozen=True)
class AutoPrompts:
    raw: RawPrompts
    chat: ChatPrompts

    def render(self, prompt: Prompt) -> tuple[str, list[int]]:
        return (self.raw if isinstance(prompt, str) else self.chat).render(prompt)


def _message(message: object) -> dict[str, str]:
    if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)):
        raise ValueError(f"a message must be {{'role': str, 'content': str}}, got {message!r}")
    return {"role": message["role"], "content": message["content"]}


def prompt_format(data: DataConfig, tokens: Tokens) -> PromptFormat:
    """The format data.prompt_format names, with data.prompt_file and data.system_prompt_file read."""
    template = _template(_read(data.prompt_file, "data.prompt_file")) if data.prompt_file else "{}"
    system = _read(data.system_prompt_file, "data.system_prompt_file") if data.system_prompt_file else None
    chat = ChatPrompts(tokens, system, template)
    if data.prompt_format != "raw" and (data.prompt_format == "chat" or system is not None):
        tokens.require_chat_template()
        return chat
    raw = RawPrompts(tokens, template)
    return raw if data.prompt_format == "raw" else AutoPrompts(raw, chat)


def _template(text: str) -> str:
    try:
        ok = text.format("\0").count("\0") == 1
    except (IndexError, KeyError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"data.prompt_file must hold one {{}} where the row's prompt goes (other braces doubled: "
                         f"{{{{ }}}}), got {text[:200]!r}")
    return text


def _read(path: str, key: str) -> str:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{key}: cannot read {path} ({exc.strerror})") from None
    return text.strip("\n")
