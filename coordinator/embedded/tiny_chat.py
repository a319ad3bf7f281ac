"""A tiny chat model for agents (tests and the agent example): the embedded character-level
Llama with the characters JSON needs, the Hermes tool-call tags as single tokens, and a compact
chat template that renders tools and tool calls (coordinator/loop/gateway/ parses them back).

The tags are tokens of their own, so text the model writes one character at a time (`<`, `t`,
`o`, ...) re-tokenizes into different tokens: exactly the case where a gateway that
re-tokenized the conversation would train on tokens the model never sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from coordinator.embedded.cache import ensure_entry
from coordinator.embedded.tiny_model import DEFAULT_SPEC, TinyModelSpec, build_char_tokenizer, init_tiny_model

EXTRA_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "{", "}", "[", "]", "<", ">", "_")
CHAT_SPEC = replace(DEFAULT_SPEC, max_position_embeddings=256)
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


def build_tiny_chat_model(out_dir: Path, spec: TinyModelSpec = CHAT_SPEC,
                          warm_rows: Sequence[tuple[Sequence[int], Sequence[int]]] = (), warm_steps: int = 0) -> Path:
    """Write the tiny chat model into out_dir; with warm_rows ((prompt ids, target ids) pairs),
    first fit it to them for warm_steps steps in this process (a few seconds: an agent's protocol,
    learnt before any service starts)."""
    model, _ = init_tiny_model(spec)
    tokenizer = build_chat_tokenizer()
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.config.vocab_size = len(tokenizer)
    if warm_rows and warm_steps:
        fit(model, list(warm_rows), warm_steps, pad_id=tokenizer.pad_token_id, seed=spec.seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def fit(model, rows: list[tuple[Sequence[int], Sequence[int]]], steps: int, *, pad_id: int, seed: int = 0,
        batch_size: int = 16, lr: float = 3e-3) -> float:
    """NLL on the targets (AdamW, seeded batches); returns the last loss."""
    import random

    import torch

    draw = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        batch = [draw.choice(rows) for _ in range(batch_size)]
        length = max(len(p) + len(t) for p, t in batch)
        ids = torch.full((len(batch), length), pad_id)
        labels = torch.full((len(batch), length), -100)
        for i, (prompt, target) in enumerate(batch):
            ids[i, :len(prompt) + len(target)] = torch.tensor([*prompt, *target])
            labels[i, len(prompt):len(prompt) + len(target)] = torch.tensor(list(target))
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def ensure_tiny_chat_model(cache_root: Path, spec: TinyModelSpec = CHAT_SPEC, *, name: str = "",
                           warm_rows: Sequence[tuple[Sequence[int], Sequence[int]]] = (), warm_steps: int = 0) -> Path:
    """Build the tiny chat model once under cache_root/models and return its directory; `name`
    tells apart warm starts (rows are not hashed: a new warm start needs a new name)."""
    path = Path(cache_root) / "models" / f"tiny-chat-{spec.cache_key()}-{len(EXTRA_TOKENS)}{'-' + name if name else ''}"
    return ensure_entry(path, lambda tmp: build_tiny_chat_model(tmp, spec, warm_rows, warm_steps))
