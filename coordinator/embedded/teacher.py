"""A stronger tiny model for distillation demos and tests: the embedded tiny Llama fine-tuned
(plain supervised steps, in this process) on the training split of the embedded arithmetic task,
never on its held-out problems. Cached under cache_root/models like the tiny model, keyed by
its recipe. A few hundred steps teach it the answer format (digits then EOS) and some sums;
it is a teacher to distill from, not a demo of SFT (the run's own warm start is `sft.*`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

from coordinator.embedded.arithmetic import make_arithmetic_splits
from coordinator.embedded.cache import ensure_entry, short_hash
from coordinator.embedded.tiny_model import DEFAULT_SPEC, TinyModelSpec, init_tiny_model


@dataclass(frozen=True)
class TeacherRecipe:
    """How the teacher is trained (its cache key)."""

    steps: int = 200
    lr: float = 3e-3
    batch_size: int = 64
    seed: int = 0
    data_seed: int = 0
    """With num_train and num_val: the embedded task's split (data.seed / num_train / num_val) whose
    training rows it learns from."""
    num_train: int = 6000
    num_val: int = 500
    spec: TinyModelSpec = DEFAULT_SPEC


def build_sft_teacher(out_dir: Path, recipe: TeacherRecipe = TeacherRecipe()) -> Path:
    """Train and save the teacher (HF checkpoint with the embedded tokenizer) into out_dir."""
    import torch

    model, tokenizer = init_tiny_model(recipe.spec)
    train, _ = make_arithmetic_splits(recipe.data_seed, recipe.num_train, recipe.num_val)
    rows = [(tokenizer(r["prompt"])["input_ids"],
             tokenizer(r["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]) for r in train]
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    rng = random.Random(recipe.seed)
    torch.manual_seed(recipe.seed)
    model.train()
    for _ in range(recipe.steps):
        batch = rng.sample(rows, recipe.batch_size)
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, (prompt, answer) in enumerate(batch):
            ids[i, :len(prompt) + len(answer)] = torch.tensor(prompt + answer)
            labels[i, len(prompt):len(prompt) + len(answer)] = torch.tensor(answer)  # the loss on the answer only
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def ensure_sft_teacher(cache_root: Path, recipe: TeacherRecipe = TeacherRecipe()) -> Path:
    """Build the teacher once under cache_root/models and return its directory."""
    key = short_hash({"recipe": {**asdict(recipe), "spec": recipe.spec.cache_key()}})
    return ensure_entry(Path(cache_root) / "models" / f"tiny-teacher-{key}", lambda tmp: build_sft_teacher(tmp, recipe))
