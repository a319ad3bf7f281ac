"""Unit tests for the embedded default model, tokenizer, task data and their caches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.embedded.arithmetic import (
    NUM_PROBLEMS,
    ensure_arithmetic_dataset,
    exact_match,
    make_arithmetic_splits,
    read_jsonl,
)
from coordinator.embedded.cache import COMPLETE_MARKER, ensure_entry
from coordinator.embedded.tiny_model import (
    DEFAULT_SPEC,
    TinyModelSpec,
    build_char_tokenizer,
    count_parameters,
    ensure_tiny_model,
    expected_parameter_count,
    tiny_model_dir,
)

SMALL_SPEC = TinyModelSpec(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def default_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("cache"))


def test_tokenizer_round_trips_spaces_digits_and_punctuation() -> None:
    tok = build_char_tokenizer()
    text = "  12+34=46\nWhat is (7*8)/2? 'yes', \"no\": a-b!  "
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id
    assert tok.eos_token_id not in ids
    assert tok.unk_token_id not in ids
    assert len(ids) == len(text) + 1  # one id per character plus BOS
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_special_tokens() -> None:
    tok = build_char_tokenizer()
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<s>", "</s>", "<unk>")
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert len(tok) == 82
    assert tok("~", add_special_tokens=False).input_ids == [tok.unk_token_id]


def test_model_dir_loads_with_auto_classes(default_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    text = "hello world 99+1="
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    model = AutoModelForCausalLM.from_pretrained(default_model_dir)
    assert model.config.model_type == "llama"
    assert not model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok)
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (1, 2, 0)
    assert next(model.parameters()).dtype.is_floating_point
    n = count_parameters(model)
    assert n == expected_parameter_count(DEFAULT_SPEC, len(tok))
    assert 0.4e6 < n < 1.2e6


def test_the_runs_embedded_tokenizer_is_the_saved_ones(default_model_dir: Path) -> None:
    """A run builds the embedded tokenizer (Tokens.of_run) instead of loading the saved copy
    the trainer and vLLM load: both must tokenize and decode alike."""
    from coordinator.data.tokens import Tokens

    built, saved = Tokens.of_run(None, str(default_model_dir)), Tokens(str(default_model_dir))  # saved: AutoTokenizer
    assert (len(built), built.eos_id) == (len(saved), saved.eos_id)
    for text in ("12+34=", "  What is (7*8)/2? 'yes', \"no\": a-b!\n", "~unknown^", ""):
        assert built.prompt(text) == saved.prompt(text) and built.answer(text) == saved.answer(text)
        ids = saved.prompt(text)
        assert built.decode(ids) == saved.decode(ids) == text.replace("~", "").replace("^", "")


def test_the_runs_embedded_tokenizer_imports_no_transformers() -> None:
    """transformers' import would cost the coordinator 1-3 CPU-s while the run's services start."""
    check = ("import sys; from coordinator.data.tokens import Tokens; tokens = Tokens.of_run(None, 'embedded'); "
             "assert tokens.prompt('1+2=') and 'transformers' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", check], check=True)


def test_model_cache_is_reused(tmp_path: Path) -> None:
    first = ensure_tiny_model(tmp_path, SMALL_SPEC)
    weights = first / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    second = ensure_tiny_model(tmp_path, SMALL_SPEC)
    assert second == first == tiny_model_dir(tmp_path, SMALL_SPEC)
    assert weights.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]


def test_model_cache_key_depends_on_spec(tmp_path: Path) -> None:
    other = TinyModelSpec(**{**SMALL_SPEC.__dict__, "seed": 1})
    assert tiny_model_dir(tmp_path, SMALL_SPEC) != tiny_model_dir(tmp_path, other)


def test_partial_cache_dirs_are_not_reused(tmp_path: Path) -> None:
    target = tiny_model_dir(tmp_path, SMALL_SPEC)
    target.parent.mkdir(parents=True)
    leftover = target.with_name(f".{target.name}.tmp-crashed")
    leftover.mkdir()
    (leftover / "config.json").write_text("{")
    target.mkdir()  # incomplete entry: no completion marker, truncated files
    (target / "config.json").write_text("{")
    built = ensure_tiny_model(tmp_path, SMALL_SPEC)
    assert built == target
    assert (built / COMPLETE_MARKER).is_file()
    assert (built / "model.safetensors").stat().st_size > 0
    assert (built / "config.json").read_text().startswith("{\n")


def test_splits_are_disjoint_and_deterministic() -> None:
    train, val = make_arithmetic_splits(seed=3, num_train=1000, num_val=200)
    assert (len(train), len(val)) == (1000, 200)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    assert (train, val) == make_arithmetic_splits(seed=3, num_train=1000, num_val=200)
    assert val != make_arithmetic_splits(seed=4, num_train=1000, num_val=200)[1]


def test_problem_rows_are_well_formed() -> None:
    train, val = make_arithmetic_splits(seed=0, num_train=NUM_PROBLEMS - 100, num_val=100)
    assert len({r["prompt"] for r in train + val}) == NUM_PROBLEMS
    for row in train[:50] + val:
        a, b = row["prompt"].removesuffix("=").split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert row["answer"] == str(int(a) + int(b))
        assert row["task"] == "arithmetic"
    with pytest.raises(ValueError):
        make_arithmetic_splits(seed=0, num_train=NUM_PROBLEMS, num_val=1)


def test_dataset_cache_is_reused(tmp_path: Path) -> None:
    train_path, val_path = ensure_arithmetic_dataset(tmp_path, seed=0)
    mtime = os.stat(train_path).st_mtime_ns
    assert ensure_arithmetic_dataset(tmp_path, seed=0) == (train_path, val_path)
    assert os.stat(train_path).st_mtime_ns == mtime
    train, val = read_jsonl(train_path), read_jsonl(val_path)
    assert len(train) + len(val) == NUM_PROBLEMS
    assert (train, val) == make_arithmetic_splits(0, len(train), len(val))


def test_exact_match() -> None:
    assert exact_match("46", "46") == 1.0
    assert exact_match(" 46\n", "46") == 1.0
    assert exact_match("461", "46") == 0.0
    assert exact_match("", "46") == 0.0


def test_losing_the_rename_race_keeps_the_winner(tmp_path: Path) -> None:
    entry = tmp_path / "things" / "entry"

    def winner(tmp: Path) -> None:
        (tmp / "who").write_text("winner")

    def loser(tmp: Path) -> None:
        (tmp / "who").write_text("loser")
        ensure_entry(entry, winner)  # a concurrent builder finishes first

    assert ensure_entry(entry, loser) == entry
    assert (entry / "who").read_text() == "winner"
    assert [p.name for p in entry.parent.iterdir()] == ["entry"]  # loser's temp dir removed
