"""A tiny chat model for agents (tests and the agent example): the embedded character-level
Llama with the characters JSON needs, the Hermes tool-call tags as single tokens, and a compact
chat template that renders tools and tool calls (coordinator/loop/gateway/ parses them back).

The tags are tokens of their own, so text the model writes one character at a time (`<`, `t`,
`o`, ...) re-tokenizes into different tokens: exactly the case where a gateway that
re-tokenized the conversation would train on tokens the model never sampled.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from coordinator.embedded.cache import ensure_entry
from coordinator.embedded.tiny_model import DEFAULT_SPEC, TinyModelSpec, build_char_tokenizer, init_tiny_model

EXTRA_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "{", "}", "[", "]", "<", ">", "_")
CHAT_SPEC = replace(DEFAULT_SPEC, max_position_embeddings=160)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}S:{{ m.content }}\n"
    "{% elif m.role == 'user' %}U:{{ m.content }}\n"
    "{% elif m.role == 'tool' %}T:{{ m.content }}\n"
    "{% elif m.role == 'assistant' %}A:{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{{ eos_token }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def build_chat_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(list(EXTRA_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_chat_model(out_dir: Path, spec: TinyModelSpec = CHAT_SPEC) -> Path:
    model, _ = init_tiny_model(spec)
    tokenizer = build_chat_tokenizer()
    model.resize_token_embeddings(len(tokenizer))
    model.config.vocab_size = len(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def ensure_tiny_chat_model(cache_root: Path, spec: TinyModelSpec = CHAT_SPEC) -> Path:
    """Build the tiny chat model once under cache_root/models and return its directory."""
    path = Path(cache_root) / "models" / f"tiny-chat-{spec.cache_key()}-{len(EXTRA_TOKENS)}"
    return ensure_entry(path, lambda tmp: build_tiny_chat_model(tmp, spec))
