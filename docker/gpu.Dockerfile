# Tandem's GPU image: the same four services on vLLM's CUDA image (CUDA, NCCL, torch and vLLM
# as vLLM ships them). Weight sync uses NCCL between the trainer and the generators.
# Linted by the test suite, not built on the CPU machines this project is developed on:
#   docker build -f docker/gpu.Dockerfile -t localhost/tandem:gpu .
#   COMPOSE_PROFILES=gpu docker compose up
ARG VLLM_IMAGE=vllm/vllm-openai:v0.11.0
FROM ${VLLM_IMAGE}
WORKDIR /srv/tandem
# Tandem's own dependencies beside the image's torch and vLLM (pyproject's list, less those two).
RUN pip install --no-cache-dir "transformers>=4.56" "grpcio==1.85.1" "grpcio-health-checking==1.85.1" \
      "grpcio-reflection==1.85.1" "protobuf>=6" "pydantic>=2.12" "pyyaml>=6" "structlog>=25" "rich>=14" \
      "matplotlib>=3.9" "tensorboard>=2.18" "math-verify>=0.9" "peft>=0.17" \
 && useradd --create-home --uid 1000 tandem \
 && mkdir -p /models /srv/tandem/runs \
 && chown tandem:tandem /models /srv/tandem/runs \
 && chmod 1777 /models /srv/tandem/runs
COPY protos protos
COPY tandem tandem
COPY coordinator coordinator
COPY trainer_svc trainer_svc
COPY generator_svc generator_svc
COPY reward_svc reward_svc
ENV PYTHONPATH=/srv/tandem TANDEM_HOME=/models PYTHONUNBUFFERED=1
USER 1000:1000
ENTRYPOINT []
CMD ["python3", "-m", "coordinator.cli.container", "coordinator"]
