"""The tokenizer as the loop needs it: prompt ids (BOS included), answer ids + EOS, decode."""

from __future__ import annotations


class Tokens:
    """The tokenizer as the loop needs it: prompt ids (BOS included), answer ids + EOS, decode."""

    def __init__(self, model_dir: str, tokenizer=None):
        """tokenizer: one already loaded (a transformers tokenizer, or a CoreTokenizer), else model_dir's."""
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._tok = tokenizer
        self.source = model_dir
        if self._tok.eos_token_id is None:
            raise ValueError(f"the tokenizer in {model_dir} has no EOS token")
        self.eos_id = int(self._tok.eos_token_id)

    @classmethod
    def of_run(cls, model_name: str | None, model_dir: str) -> Tokens:
        """A run's tokenizer: policy.model_name's (`model_name`, loaded from model_dir), or when
        that is unset the embedded model's, built here on the `tokenizers` library alone: what
        its saved copy in model_dir holds (tests/unit/coordinator/data/test_embedded.py checks they
        tokenize alike). Importing transformers, for AutoTokenizer or even its fast-tokenizer
        class, costs the coordinator ~1-3 CPU-s while the run's services start beside it."""
        if model_name is not None:
            return cls(model_dir)
        from coordinator.embedded.tiny_model import EOS, char_tokenizer

        return cls(model_dir, CoreTokenizer(char_tokenizer(), EOS))

    def __len__(self) -> int:
        return len(self._tok)

    def require_chat_template(self) -> None:
        if not self._tok.chat_template:
            raise ValueError(f"the tokenizer in {self.source} has no chat template (tokenizer_config.json chat_template "
                             "or chat_template.jinja): add one, or set data.prompt_format raw and drop "
                             "data.system_prompt_file")

    def chat_text(self, messages: list[dict[str, str]]) -> str:
        """The messages rendered by the chat template, ending with the assistant's generation prompt."""
        self.require_chat_template()
        return self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def prompt(self, text: str) -> list[int]:
        return list(self._tok(text)["input_ids"])

    def answer(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of text without special tokens (e.g. an environment's observation)."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])


class CoreTokenizer:
    """A `tokenizers.Tokenizer` behind the part of transformers' tokenizer API that `Tokens`
    uses (no chat template)."""

    chat_template = None

    def __init__(self, core, eos_token: str):
        self._core = core
        self.eos_token_id = core.token_to_id(eos_token)

    def __len__(self) -> int:
        return self._core.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self._core.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._core.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, *args, **kwargs) -> str:
        raise ValueError("this tokenizer has no chat template")
