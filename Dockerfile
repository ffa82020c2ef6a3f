# The sonicsite image: the operator, the gateway, the `helm test` check and the demo-model
# builder (the chart's init container). Runs as a non-root user.
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sonicsite sonicsite
COPY client client
COPY operator operator
COPY gateway gateway
COPY models models
COPY bench bench
COPY sim sim
# torch from the CPU wheel index only: the demo models are built on the CPU
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && pip install ".[client,operator,gateway,models]" \
 && pip install --no-deps "weaver-core==0.5.3" \
 && rm -rf /src

RUN useradd --uid 10001 --create-home --home-dir /home/sonicsite sonicsite
USER 10001
WORKDIR /home/sonicsite
ENTRYPOINT []
CMD ["sonicsite", "--help"]
