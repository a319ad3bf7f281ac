"""Reward-model scorer: a Hugging Face sequence-classification model with one scalar output
(`num_labels=1`, e.g. LlamaForSequenceClassification) scores prompt + completion.

The model is loaded once, in the service process, and every forward pass runs on one
dedicated thread (torch releases the GIL, so the gRPC event loop keeps serving). A Score
call's items are scored together in batches of `batch_size`, sorted by length so that
little padding is spent.

Tensor conventions: input_ids and attention_mask are [B, T] int64, right padded with the
tokenizer's pad id (attention_mask 0 on pads); sequences longer than max_length keep their
end (left truncation). The model returns logits [B, 1]: the score head's value at each row's
last non-pad token (HF's pooling for decoder classifiers, from config.pad_token_id), which
with right padding is the row's last real token, the completion's end.

reward = the scalar (or sigmoid(scalar) with squash: sigmoid); correct = scalar > 0.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

from reward_svc.config import RewardModelSettings
from reward_svc.types import ScoreItem, ScoreResult


class RewardModel:
    """A loaded reward model; `score_texts` runs on the caller's thread, `score` on its own."""

    def __init__(self, settings: RewardModelSettings):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._settings = settings
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(settings.model_name)
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"the reward model's tokenizer ({settings.model_name}) has no pad token")
        self.model = AutoModelForSequenceClassification.from_pretrained(
            settings.model_name, dtype=getattr(torch, settings.dtype)).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"{settings.model_name} has num_labels={self.model.config.num_labels}; "
                             "a reward model needs exactly one scalar output (num_labels=1)")
        if self.model.config.pad_token_id is None:  # HF's pooling finds the last token through it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if self.model.config.pad_token_id != self.tokenizer.pad_token_id:
            raise ValueError(f"model pad_token_id {self.model.config.pad_token_id} != tokenizer's "
                             f"{self.tokenizer.pad_token_id}")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-model")

    def score_texts(self, texts: list[str]) -> list[float]:
        """Raw scalar per text, in order, batch_size texts per forward pass."""
        torch = self._torch
        encoded = [self.tokenizer(t, truncation=True, max_length=self._settings.max_length).input_ids for t in texts]
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        scores = [0.0] * len(texts)
        size = self._settings.batch_size
        with torch.inference_mode():
            for start in range(0, len(order), size):
                rows = order[start:start + size]
                batch = self.tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, padding=True,
                                           return_tensors="pt")
                logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                for i, value in zip(rows, logits[:, 0].float().tolist()):
                    scores[i] = value
        return scores

    def to_result(self, scalar: float) -> ScoreResult:
        reward = 1.0 / (1.0 + math.exp(-scalar)) if self._settings.squash == "sigmoid" else scalar
        return ScoreResult(reward=reward, correct=scalar > 0)

    async def score(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """Score prompt + completion of each item on the model's thread (ground truth unused)."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        scalars = await loop.run_in_executor(self._executor, self.score_texts,
                                             [i.prompt + i.completion for i in items])
        return [self.to_result(s) for s in scalars]

    @classmethod
    async def load(cls, settings: RewardModelSettings) -> RewardModel:
        """Load off the event loop (the service stays NOT_SERVING meanwhile)."""
        return await asyncio.to_thread(cls, settings)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
