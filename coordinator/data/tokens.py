"""The tokenizer as the loop needs it: prompt ids (BOS included), answer ids + EOS, decode."""

from __future__ import annotations


class Tokens:
    """The tokenizer as the loop needs it: prompt ids (BOS included), answer ids + EOS, decode."""

    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(model_dir)
        if self._tok.eos_token_id is None:
            raise ValueError(f"the tokenizer in {model_dir} has no EOS token")
        self.eos_id = int(self._tok.eos_token_id)

    def prompt(self, text: str) -> list[int]:
        return list(self._tok(text)["input_ids"])

    def answer(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of text without special tokens (e.g. an environment's observation)."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])
