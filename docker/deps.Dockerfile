# Tandem's Python dependencies (CPU torch, vLLM for CPU, the rest) as a venv on the local
# Debian base. Built by docker/prepare.sh with its wheel directory as the build context, so
# nothing is fetched during the build; the wheels stay in the first stage.
FROM localhost/tandem-base:bookworm AS wheels
COPY . /wheels
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels /wheels/*.whl

FROM localhost/tandem-base:bookworm
COPY --from=wheels /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
