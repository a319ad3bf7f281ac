"""Chat data (coordinator/data/prompts.py, read_examples): messages rows rendered by the
tokenizer's chat template with its generation prompt, to exactly the ids transformers'
`apply_chat_template(tokenize=True)` gives; raw strings as before; NeMo-RL's prompt_file and
system_prompt_file; local datasets through the `datasets` library with column mapping; bad
rows and settings refused with the file, row and key to change."""

from __future__ import annotations

import json

import datasets
import pytest

from coordinator.config import load_config
from coordinator.data.examples import read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.tiny_model import build_char_tokenizer

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""A ChatML template (the Qwen families' format), written here."""
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
"""A template that writes BOS itself (as Llama-3's and Gemma's do): it must not be doubled."""


@pytest.fixture(scope="module")
def bpe():
    from tests.families import FAMILIES, build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer(FAMILIES["qwen2"].tokenizer)
    tokenizer.chat_template = CHATML
    return tokenizer


def _char(template: str | None = BOS_TEMPLATE):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _data(tmp_path, *overrides):
    return load_config(overrides=["data.dataset_name=jsonl", f"data.train_path={tmp_path / 'train.jsonl'}",
                                  *overrides]).data


MESSAGES = [{"role": "user", "content": "What is 12+34?"}]


@pytest.mark.parametrize("tokenizer_name", ["bpe", "char"])
def test_messages_render_to_the_ids_of_apply_chat_template(tokenizer_name, tmp_path, request):
    tokenizer = request.getfixturevalue("bpe") if tokenizer_name == "bpe" else _char()
    path = _write(tmp_path / "train.jsonl", [{"messages": MESSAGES, "answer": "46"}])
    (example,) = read_examples(path, _data(tmp_path), Tokens("test", tokenizer))
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(example.prompt_ids) == list(expected)
    assert example.prompt == tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert example.answer == "46" and example.task == "arithmetic"
    if tokenizer_name == "char":  # the template's BOS, once
        assert list(example.prompt_ids).count(tokenizer.bos_token_id) == 1


def test_raw_strings_keep_their_ids_and_prompt_file_wraps_them(tmp_path):
    tokenizer = _char()
    path = _write(tmp_path / "train.jsonl", [{"prompt": "12+34=", "answer": "46"}])
    (plain,) = read_examples(path, _data(tmp_path), Tokens("test", tokenizer))
    assert plain.prompt == "12+34=" and list(plain.prompt_ids) == tokenizer("12+34=")["input_ids"]  # BOS added
    (tmp_path / "prompt.txt").write_text("Add: {} Answer\n")
    (wrapped,) = read_examples(path, _data(tmp_path, f"data.prompt_file={tmp_path / 'prompt.txt'}"),
                               Tokens("test", tokenizer))
    assert wrapped.prompt == "Add: 12+34= Answer"


def test_system_prompt_goes_first_unless_the_messages_have_one(tmp_path, bpe):
    (tmp_path / "system.txt").write_text("You add numbers.\n")
    rows = [{"messages": MESSAGES, "answer": "46"},
            {"messages": [{"role": "system", "content": "Own."}, *MESSAGES], "answer": "46"},
            {"prompt": "1+1=", "answer": "2"}]
    path = _write(tmp_path / "train.jsonl", rows)
    first, own, string = read_examples(path, _data(tmp_path, f"data.system_prompt_file={tmp_path / 'system.txt'}"),
                                       Tokens("test", bpe))
    assert first.prompt.startswith("<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\nWhat is")
    assert own.prompt.startswith("<|im_start|>system\nOwn.<|im_end|>") and "You add" not in own.prompt
    assert string.prompt == ("<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n"
                             "<|im_start|>assistant\n")  # a system prompt makes strings chat too


def test_prompt_format_chat_templates_strings_and_raw_refuses_messages(tmp_path, bpe):
    path = _write(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    (chat,) = read_examples(path, _data(tmp_path, "data.prompt_format=chat"), Tokens("test", bpe))
    assert chat.prompt == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    _write(path, [{"messages": MESSAGES, "answer": "46"}])
    with pytest.raises(ValueError, match=r"train.jsonl: row 1: .*data.prompt_format is raw"):
        read_examples(path, _data(tmp_path, "data.prompt_format=raw"), Tokens("test", bpe))


def test_local_parquet_and_save_to_disk_splits_with_column_mapping(tmp_path):
    rows = {"question": ["1+1=", "2+2="], "solution": ["2", "4"]}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "train.parquet"))
    data = load_config(overrides=["data.dataset_name=local", f"data.train_path={tmp_path / 'train.parquet'}",
                                  "data.prompt_key=question", "data.answer_key=solution"]).data
    tokens = Tokens("test", _char())
    assert [(e.prompt, e.answer) for e in read_examples(tmp_path / "train.parquet", data, tokens)] == [
        ("1+1=", "2"), ("2+2=", "4")]
    chat = {"messages": [MESSAGES, [{"role": "user", "content": "3+3?"}]], "solution": ["46", "6"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                          "test": datasets.Dataset.from_dict(chat)}).save_to_disk(str(tmp_path / "dd"))
    held_out = read_examples(tmp_path / "dd", data, tokens, split=data.val_split)
    assert [e.answer for e in held_out] == ["46", "6"] and held_out[1].prompt.endswith("user: 3+3?\nassistant: ")
    with pytest.raises(ValueError, match=r"has the splits \['test', 'train'\], not 'dev': set data.train_split"):
        read_examples(tmp_path / "dd", data, tokens, split="dev")


def test_bad_rows_and_settings_say_what_to_change(tmp_path, bpe):
    path = _write(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"question": "x"}])
    with pytest.raises(ValueError, match=r"row 2 has no 'prompt' \(or 'messages'\) and 'answer'; its keys: \['question'\]"):
        read_examples(path, _data(tmp_path), Tokens("test", bpe))
    _write(path, [{"messages": [{"role": "user"}], "answer": "2"}])
    with pytest.raises(ValueError, match=r"row 1: a message must be \{'role': str, 'content': str\}"):
        read_examples(path, _data(tmp_path), Tokens("test", bpe))
    _write(path, [{"messages": MESSAGES, "answer": "2"}])
    with pytest.raises(ValueError, match="has no chat template .* set data.prompt_format raw"):
        read_examples(path, _data(tmp_path), Tokens("test", _char(None)))
    (tmp_path / "prompt.txt").write_text("no placeholder")
    with pytest.raises(ValueError, match=r"data.prompt_file must hold one \{\}"):
        read_examples(path, _data(tmp_path, f"data.prompt_file={tmp_path / 'prompt.txt'}"), Tokens("test", bpe))
    with pytest.raises(ValueError, match="data.system_prompt_file: cannot read"):
        read_examples(path, _data(tmp_path, f"data.system_prompt_file={tmp_path / 'nope.txt'}"), Tokens("test", bpe))
