"""The Megatron-core backend: HF Llama/Qwen2 checkpoints converted (once, cached) into a
local-spec GPTModel trained with TP/PP/DP and Megatron's optimizers (see `backend.py`).

Nothing here is imported eagerly: `settings` is pydantic only, the rest loads megatron-core.
"""
