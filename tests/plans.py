"""A tensor-parallel plan in NeMo-RL's custom_parallel_plan form, for the tests
(`policy.dtensor_cfg.custom_parallel_plan: tests.plans.llama_tp_plan`): module path patterns of
an HF Llama to torch ParallelStyles. The head's logits stay sharded over the vocabulary (a
DTensor), as in NeMo-RL's example; the backend gathers them."""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def llama_tp_plan() -> dict:
    return {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        **{f"model.layers.*.self_attn.{n}_proj": ColwiseParallel() for n in "qkv"},
        "model.layers.*.self_attn.o_proj": RowwiseParallel(),
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }


not_a_plan = ["model.embed_tokens"]
