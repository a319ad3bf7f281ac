# Tandem's GPU image: the same four services on vLLM's CUDA image (CUDA, NCCL, torch and vLLM as
# vLLM ships them: vllm 0.32.0 on torch 2.13.0), plus megatron-core and Tandem's own dependencies.
# The versions are requirements/gpu.txt's (scripts/setup.sh installs that file on a GPU host; the
# `gpu` extra of pyproject.toml names them too; tests/unit/docker/test_gpu_pins.py checks all three).
# Linted by the test suite, not built on the CPU machines this project is developed on:
#   docker build -f docker/gpu.Dockerfile -t localhost/tandem:gpu .
#   COMPOSE_PROFILES=gpu docker compose up
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}
WORKDIR /srv/tandem
COPY requirements/gpu.txt requirements/gpu.txt
# requirements/gpu.txt (torch and vllm as the image has them; megatron-core added), then
# pyproject.toml's dependencies less torch and megatron-core (protobuf 7.35+: the generated code
# in protos/ says "Protobuf Python Version: 7.35.1"). compose's healthchecks run `python`: the
# image has python3 only, so `python` is linked to it.
RUN pip install --no-cache-dir -r requirements/gpu.txt \
 && pip install --no-cache-dir "transformers>=5.16" "tokenizers>=0.23" "safetensors>=0.6" "accelerate>=1.10" \
      "numpy>=2" "grpcio==1.85.1" "grpcio-health-checking==1.85.1" "grpcio-reflection==1.85.1" \
      "protobuf>=7.35,<8" "pydantic>=2.12" "pyyaml>=6" "structlog>=25" "rich>=14" "matplotlib>=3.9" \
      "tensorboard>=2.18" "math-verify>=0.9" "peft>=0.17" "datasets>=4" "fastapi>=0.133,<0.137" "uvicorn>=0.30" \
      "openai>=2.25" "jsonschema>=4.23" \
 && if ! command -v python >/dev/null; then ln -s "$(command -v python3)" /usr/local/bin/python; fi \
 && python -c "import google.protobuf, megatron.core, torch, vllm" \
 && useradd --create-home --uid 1000 tandem \
 && mkdir -p /models /srv/tandem/runs \
 && chown tandem:tandem /models /srv/tandem/runs /home/tandem \
 && chmod 1777 /models /srv/tandem/runs /home/tandem
COPY protos protos
COPY tandem tandem
COPY coordinator coordinator
COPY trainer_svc trainer_svc
COPY generator_svc generator_svc
COPY reward_svc reward_svc
ENV PYTHONPATH=/srv/tandem TANDEM_HOME=/models PYTHONUNBUFFERED=1 THP_MEM_ALLOC_ENABLE=1 HOME=/home/tandem
USER 1000:1000
ENTRYPOINT []
CMD ["python", "-m", "coordinator.cli.container", "coordinator"]
