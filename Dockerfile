# The sonicsite image: the operator, the gateway, the `helm test` check and the demo-model
# builder (the chart's init container). Runs as a non-root user.
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY sonicsite sonicsite
COPY client client
COPY operator operator
COPY gateway gateway
COPY models models
COPY bench bench
COPY sim sim
# torch from the CPU wheel index only: the demo models are built on the CPU; the rest at the
# versions the suite ran with (constraints.txt)
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && pip install -c constraints.txt ".[client,operator,gateway,models]" \
 && pip install -c constraints.txt --no-deps "weaver-core==0.5.3" \
 && rm -rf /src

RUN useradd --uid 10001 --create-home --home-dir /home/sonicsite sonicsite
USER 10001
WORKDIR /home/sonicsite
ENTRYPOINT []
CMD ["sonicsite", "--help"]
