# streamtrain — the front door. `make help` lists the targets; CI calls the same ones.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := ps/streamtrain_ps/proto/ps.proto worker/streamtrain_worker/proto/worker.proto

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

# Each step says what it does and pip shows its progress: a first install downloads ~1 GB
# (torch alone ~200 MB) and takes minutes. The last step compiles the numba kernels into
# their on-disk cache, so the first pass of the first run does not (docs/benchmarks.md).
$(STAMP): pyproject.toml constraints.txt
	@echo "== install 1/5: the virtualenv $(VENV)/"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "== install 2/5: pip itself"
	$(PY) -m pip install --upgrade pip
	@echo "== install 3/5: PyTorch (CPU, the largest download)"
	$(PY) -m pip install torch==2.13.0
	@echo "== install 4/5: streamtrain and its dependencies (editable, every extra)"
	$(PY) -m pip install -c constraints.txt -e '.[dev]'
	@echo "== install 5/5: the numba kernels' cache"
	$(PY) -m streamtrain_tools.warm_cache
	touch $(STAMP)
	@echo "== installed: $(VENV)/ (make help lists what to run)"

install: $(STAMP) ## Create .venv/ and install streamtrain with every extra (idempotent)

proto: $(STAMP) ## Regenerate the gRPC modules from the .proto files
	$(PY) -m grpc_tools.protoc -Ips --python_out=ps --pyi_out=ps --grpc_python_out=ps ps/streamtrain_ps/proto/ps.proto
	$(PY) -m grpc_tools.protoc -Iworker --python_out=worker --pyi_out=worker --grpc_python_out=worker worker/streamtrain_worker/proto/worker.proto worker/streamtrain_worker/proto/serving.proto

proto-check: proto ## Fail if the committed generated code differs from a fresh generation
	@git diff --exit-code -- '*_pb2.py' '*_pb2_grpc.py' '*_pb2.pyi' || \
	  (echo "generated protobuf code is stale: run 'make proto' and commit" >&2; exit 1)

lint: $(STAMP) ## ruff (style, imports) and import-linter (layers)
	$(VENV)/bin/ruff check ps worker operator tools tests
	$(VENV)/bin/ruff format --check ps worker operator tools tests
	$(VENV)/bin/lint-imports

fmt: $(STAMP) ## Format and autofix with ruff
	$(VENV)/bin/ruff format ps worker operator tools tests
	$(VENV)/bin/ruff check --fix ps worker operator tools tests

typecheck: $(STAMP) ## mypy over the three packages
	$(VENV)/bin/mypy ps/streamtrain_ps worker/streamtrain_worker operator/streamtrain_operator tools/streamtrain_tools

# The alert and dashboard contract tests start a real Prometheus and run promtool (Debian's
# prometheus package); the serving tests start redis-server; the report test screenshots a
# page in headless Chromium (Debian's chromium). Installed only when missing, so reruns
# never touch apt.
test-deps: ## Install the system tools the tests need (prometheus, promtool, redis-server, chromium) when missing
	@MISSING=""; \
	if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
	  MISSING="$$MISSING prometheus"; fi; \
	if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then \
	  MISSING="$$MISSING redis-server"; fi; \
	if ! command -v chromium >/dev/null 2>&1; then MISSING="$$MISSING chromium"; fi; \
	if [ -n "$$MISSING" ]; then \
	  SUDO=""; if [ "$$(id -u)" -ne 0 ]; then SUDO="sudo"; fi; \
	  set -x; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$MISSING; \
	fi

pytest: $(STAMP) test-deps ## Only the test suite
	$(PY) -m pytest -q --durations=15

test: $(STAMP) test-deps proto-check lint typecheck pytest ## Everything CI checks: generated code, lint, types, tests

test-deep: $(STAMP) ## The model and property tests with many more examples (minutes)
	STREAMTRAIN_DEEP=1 $(PY) -m pytest -q -o timeout=3600 tests/ps/test_table_model.py tests/ps/test_finite_rows.py

test-faults: $(STAMP) ## Fault-injection suite (also part of `make test`)
	$(PY) -m pytest -q -m faults

# MUTANTS: which mutants to run (mutmut's name globs), e.g.
# `make test-mutants MUTANTS='streamtrain_operator.job.scheduler*'`; default: every one of
# the modules [tool.mutmut] lists (hours on two cores). Runs in .mutation/ (see
# tools/streamtrain_tools/mutation.py); the survivors are listed at the end.
# MUTANT_TESTS: test files to run instead of [tool.mutmut]'s selection (a short run).
MUTANTS ?=
MUTANT_TESTS ?=
test-mutants: $(STAMP) ## Mutation run over the core invariants ([tool.mutmut] in pyproject.toml)
	$(PY) -m streamtrain_tools.mutation $(MUTANTS) $(if $(MUTANT_TESTS),--tests $(MUTANT_TESTS))

bench: bench-ps bench-worker bench-e2e bench-load bench-quality ## All benchmarks (results go in docs/benchmarks.md)

bench-ps: $(STAMP) ## PS shard throughput and memory per key
	$(PY) -m streamtrain_tools.bench.ps --json

bench-worker: $(STAMP) ## Worker: plain PyTorch vs PS-backed training, parse throughput
	$(PY) -m streamtrain_tools.bench.worker --json

bench-e2e: $(STAMP) ## Criteo sample as 24 hourly passes, end to end
	$(PY) -m streamtrain_tools.bench.worker.e2e --json

bench-read-ahead: $(STAMP) ## A RunPass's fixed cost with and without the next pass read ahead
	$(PY) -m streamtrain_tools.bench.worker.read_ahead --json

bench-quality: $(STAMP) ## streamtrain's defaults vs Vowpal Wabbit vs plain PyTorch: samples, long-tail stream, families (fresh seed)
	$(PY) -m streamtrain_tools.bench.quality --json

bench-serving: $(STAMP) test-deps ## Online serving: freshness, delta apply, latency, exactness, Redis memory
	$(PY) -m streamtrain_tools.bench.serving --json

bench-load: $(STAMP) ## Concurrent clients against 2 PS shards
	$(PY) -m streamtrain_tools.bench.ps.load --json

# The peer (PaddlePaddle's parameter server) lives in a virtualenv of its own: nothing of it
# enters .venv. Pins: paddle 2.6 reads protobuf's FieldDescriptor.label (gone in protobuf 7)
# and, on Python 3.11, needs protobuf's upb runtime (>= 4.21); numpy 1.x as in the runs
# recorded in docs/benchmarks.md.
PEER_VENV := .venv-peer
PEER_PYTHON ?= $(PYTHON)
$(PEER_VENV)/.installed:
	test -x $(PEER_VENV)/bin/python || $(PEER_PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install -q paddlepaddle==2.6.2 'protobuf>=4.21,<5' 'numpy<2'
	touch $@

bench-peer: $(STAMP) $(PEER_VENV)/.installed ## Ours vs PaddlePaddle's PS, alternating (opt-in: not in `make bench`)
	$(PY) -m streamtrain_tools.bench.peer --json --peer-python $(PEER_VENV)/bin/python

bench-tls: $(STAMP) ## What mutual TLS costs a worker's pull and push (plain vs TLS shard, alternating)
	$(PY) -m streamtrain_tools.bench.ps.tls_cost --json

bench-ps-scale: $(STAMP) ## One PS shard at the long tail: bytes/key, peaks, unique keys/s, saves
	$(PY) -m streamtrain_tools.bench.ps.scale --json

demo: $(STAMP) ## Two days of a synthetic stream through PS + workers on this machine (demo-run/)
	$(PY) -m streamtrain_tools.demo

crds: $(STAMP) ## Regenerate the CRD, the chart's copy and docs/crd-reference.md from spec.py
	$(PY) -m streamtrain_tools.crdgen

chart: $(STAMP) ## Render the Helm chart offline (no cluster, no helm binary) into chart-render/
	$(PY) -m streamtrain_tools.chart --out chart-render

crds-check: $(STAMP) ## Fail if the committed CRD files differ from a fresh generation
	$(PY) -m streamtrain_tools.crdgen --check

IMAGE_TAG ?= 0.1.0
IMAGE_PREFIX ?= streamtrain
images: ## Build the ps, operator and worker images (docker, else buildah)
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then B="docker build"; \
	elif command -v buildah >/dev/null 2>&1; then B="buildah bud --layers"; \
	else echo "make images: neither a running docker daemon nor buildah found; install one (e.g. apt-get install buildah)" >&2; exit 1; fi; \
	set -x; \
	$$B -f Dockerfile.ps --target ps -t $(IMAGE_PREFIX)-ps:$(IMAGE_TAG) . && \
	$$B -f Dockerfile.ps --target operator -t $(IMAGE_PREFIX)-operator:$(IMAGE_TAG) . && \
	$$B -f Dockerfile.worker -t $(IMAGE_PREFIX)-worker:$(IMAGE_TAG) .

# checkov pins its own dependency tree (boto3, networkx, pydantic ...) against the project's
# constraints.txt: it lives in a virtualenv of its own, like the peer.
CHECKOV_VENV := .venv-checkov
$(CHECKOV_VENV)/.installed:
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q checkov==3.3.30
	touch $@

lint-manifests: $(STAMP) test-deps $(CHECKOV_VENV)/.installed ## hadolint, chart lint/render, kubernetes-validate, promtool, checkov (accepted checks: docs/security.md)
	$(VENV)/bin/hadolint Dockerfile.ps Dockerfile.worker
	$(PY) -m pytest -q tests/contract/test_chart.py tests/contract/test_manifests.py \
	  tests/contract/test_images.py tests/contract/test_alerts.py
	$(PY) -m streamtrain_tools.lint_manifests --checkov $(CHECKOV_VENV)/bin/checkov

clean: ## Remove caches and demo output (keeps .venv)
	rm -rf .pytest_cache .mypy_cache .ruff_cache demo-run chart-render

.PHONY: help install proto proto-check lint fmt typecheck test-deps pytest test test-faults test-deep test-mutants bench bench-ps bench-worker bench-e2e bench-read-ahead bench-load bench-serving bench-tls bench-ps-scale bench-quality bench-peer demo chart crds crds-check images lint-manifests clean
