#!/usr/bin/env bash
# The GPU checks of shared/GPU.md, on a lent NVIDIA machine that reaches no registry, from the kit that
# `make gpu-kit` built on the machine without a GPU (scripts/gpu_kit.py): nothing is compiled there.
#
# The kit is .gpu/p00, .gpu/p01, ... (ignored by git), each under the 64 MiB a call carries; p00 holds
# MANIFEST.json (every file's sha256 and chunks). Pieces are ordered as the phases need them: our wheels,
# the native CUDA tools and the dependencies first, then SmolLM2, then what only the Ray bench and Gemma need.
# One call a piece, back to back (the machine keeps /tmp while warm, about 30 s idle):
#   call 1      carry .gpu/p00:  scripts/gpu_session.sh stash .gpu/p00
#   call 2..n-1 carry .gpu/pNN:  scripts/gpu_session.sh stash .gpu/pNN
#   call n      carry .gpu/pNN:  scripts/gpu_session.sh stash .gpu/pNN && scripts/gpu_session.sh all
# Phases:
#   stash D   copy carried piece D into the work folder
#   install   join the pieces present (sha256 checked), a fresh venv, plain pip install of llamaplug[server],
#             the CPU and CUDA plugins and the test tools from the carried wheels only, the native CUDA tools
#             unpacked, the model wheels that are complete; `llamaplug info` (CUDA must be chosen)
#   test      the CUDA plugin's tests, a CPU/GPU subset of the suite, greedy text against native CUDA llama-completion
#   bench     bench/run.py --backend cuda against native CUDA llama-bench, per installed model
#   ray       bench/ray_serve.py on the machine's cores (needs the ray pieces)
#   all       install, test, bench, ray; logs and results under $OUT
# LPGPU_TEST_LIMIT (default 200 s) bounds the CPU/GPU subset of the suite (a 2-core machine's dry run needs more).
# DRY_RUN=1 runs the CPU-only paths on a machine without a GPU or NVIDIA wheels (the kit's CPU side, checked
# where it is built): no CUDA plugin is required, CPU is expected in `llamaplug info`, the CUDA steps say they skip.
set -uo pipefail
W=${LPGPU_WORK:-/tmp/lpgpu}
REPO=$W/repo
VENV=$W/venv
KIT=$W/kit
PYTHON=${LPGPU_PYTHON:-python3}
export LLAMAPLUG_CACHE=$W/cache
OUT=${OUT:-$W/out}
PY=$VENV/bin/python
DRY=${DRY_RUN:-}
NATIVE=$KIT/native/bin

# The image's compiler (/opt/gcc) links libstdc++ statically into each shared library, so every llamaplug
# library built there carries and exports its own copy; in a Python process the copies mix and std::regex
# crashes in the first tokenizer call. The kit's libraries are built elsewhere with the shared libstdc++,
# so this only acts if a library without a libstdc++ dependency turns up.
preload_libstdcxx() {
  local lib
  lib=$($PY -c 'import llamaplug, pathlib; print(pathlib.Path(llamaplug.__file__).parent / "lib" / "libllama.so")')
  if ! ldd "$lib" | grep -q libstdc++; then export LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6); fi
}

# NVIDIA's runtime libraries for the native tools (llama.cpp's own build finds them by the loader's path).
nvidia_libs() {
  $PY - <<'EOF'
import glob, os, sysconfig
site = sysconfig.get_paths()["purelib"]
print(":".join(d for d in glob.glob(os.path.join(site, "nvidia", "*", "lib")) + glob.glob(os.path.join(site, "nvidia", "*", "*", "lib"))))
EOF
}

join_pieces() {
  mkdir -p "$KIT"
  $PYTHON - "$W/pieces" "$KIT" <<'EOF'
import hashlib, json, sys
from pathlib import Path
pieces, kit = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((pieces / "p00" / "MANIFEST.json").read_text())
complete, missing = 0, []
for rel, entry in manifest["files"].items():
    target = kit / rel
    if target.exists() and target.stat().st_size == entry["size"]:
        complete += 1
        continue
    chunks = [pieces / c for c in entry["chunks"]]
    if not all(c.exists() for c in chunks):
        missing.append(rel)
        continue
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for c in chunks:
            data = c.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != entry["sha256"]:
        target.unlink()
        sys.exit(f"join: {rel}: sha256 mismatch")
    complete += 1
print(f"join: {complete} of {len(manifest['files'])} files complete; not yet carried: {', '.join(missing) or 'none'}")
print(f"kit built from {manifest['built']['commit']}, CUDA {manifest['built']['cuda']}, times {manifest['built']['times_s']}")
EOF
}

phase_install() {
  join_pieces || return 1
  rm -rf "$REPO" "$VENV" && mkdir -p "$REPO" "$OUT" "$LLAMAPLUG_CACHE"
  # The working tree (tests, bench) without the kit: the packages come from the wheels only.
  tar --exclude='./.gpu*' --exclude='./.git' --exclude='*/build' -cf - . | tar -xf - -C "$REPO"
  $PYTHON -m venv "$VENV" || return 1
  local site host wanted
  site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  host=$($PYTHON -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # NVIDIA's runtime wheels as pip would have installed them (the image has them; the registry is out of reach).
  for d in "$host"/nvidia "$host"/nvidia_cublas-* "$host"/nvidia_cuda_runtime-*; do [ -e "$d" ] && ln -s "$d" "$site/"; done
  wanted="llamaplug[server] llamaplug-backend-cpu llamaplug-backend-rpc pytest openai gguf"
  local cuda_alone=""
  if ls "$KIT"/wheels/llamaplug_backend_cuda-*.whl >/dev/null 2>&1; then
    if [ -n "$DRY" ] && ! ls -d "$host"/nvidia_cuda_runtime-* >/dev/null 2>&1; then
      cuda_alone=1  # a dry run where no NVIDIA wheels are installed: the plugin alone, its probe then says no driver
    else wanted="$wanted llamaplug-backend-cuda"; fi
  elif [ -z "$DRY" ]; then echo "install: the kit has no CUDA plugin wheel (built with --skip-cuda?)"; return 1; fi
  local t0=$(date +%s)
  # Plain pip: names resolved from the carried folders alone.
  $PY -m pip install -q --no-index --find-links "$KIT/wheels" --find-links "$KIT/deps" $wanted \
      > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; return 1; }
  if [ -n "$cuda_alone" ]; then
    $PY -m pip install -q --no-index --no-deps "$KIT"/wheels/llamaplug_backend_cuda-*.whl >> "$OUT/install.log" 2>&1 \
        || { tail -20 "$OUT/install.log"; return 1; }
    wanted="$wanted llamaplug-backend-cuda(--no-deps)"
  fi
  echo "install: $wanted in $(( $(date +%s) - t0 )) s"
  if ls "$KIT"/deps-ray/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --find-links "$KIT/wheels" --find-links "$KIT/deps" --find-links "$KIT/deps-ray" \
        'llamaplug[ray]' >> "$OUT/install.log" 2>&1 && echo "install: ray extra"
  fi
  if [ -f "$KIT/native-cuda.tar.xz" ]; then mkdir -p "$KIT/native" && tar -xJf "$KIT/native-cuda.tar.xz" -C "$KIT/native"
    echo "native CUDA tools: $(ls "$NATIVE" | grep -c '^llama-') tools"
  else echo "native CUDA tools: not in the kit"; fi
  for m in "$KIT"/models/*.whl; do [ -e "$m" ] && $PY -m pip install -q --no-index --no-deps "$m"; done
  $PY -c 'from llamaplug.catalog import entries; [print("model", e.name, e.locate()) for e in entries()]'
  $VENV/bin/llamaplug info > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt"
  if [ -z "$DRY" ]; then grep -q "^ *cuda .*loaded" "$OUT/info.txt" || { echo "install: CUDA is not loaded"; return 1; }; fi
}

# bounded SECONDS LOG CMD...: CMD with a time limit, its output in LOG and its tail on stdout; a run the limit cut
# short says so in both (a log of dots with no summary line reads like a pass otherwise).
bounded() {
  local limit=$1 log=$2; shift 2
  timeout "$limit" "$@" > "$log" 2>&1; local rc=$?
  [ $rc -eq 124 ] && echo "TIMED OUT after $limit s: $*" >> "$log"
  tail -8 "$log"; return $rc
}

phase_test() {
  preload_libstdcxx; mkdir -p "$OUT"; cd "$REPO"
  if [ -z "$DRY" ]; then
    bounded 240 "$OUT/test_cuda.txt" env LLAMAPLUG_BACKENDS=cuda $PY -m pytest -q -p no:cacheprovider \
        plugins/backend_cuda/tests
    # Greedy text against llama.cpp's own CUDA build (the numerics reference on a GPU is native CUDA, not our CPU).
    bounded 180 "$OUT/test_greedy_cuda.txt" env LLAMAPLUG_NATIVE_TOOLS=$NATIVE LD_LIBRARY_PATH=$(nvidia_libs) \
        $PY -m pytest -q -p no:cacheprovider tests/test_greedy_native.py
  else echo "test: DRY_RUN, the CUDA tests and the native CUDA comparison skip"; fi
  # With the CUDA plugin installed every Llama here runs on the GPU (layers placed by n_gpu_layers="auto").
  bounded "${LPGPU_TEST_LIMIT:-200}" "$OUT/test_rest.txt" $PY -m pytest -q -p no:cacheprovider -x \
      tests/test_completion.py tests/test_batch.py tests/test_offload.py tests/test_samplers.py
}

phase_bench() {
  preload_libstdcxx; mkdir -p "$OUT"; cd "$REPO"
  [ -n "$DRY" ] && { echo "bench: DRY_RUN, skipped (it needs the native CUDA tools)"; return 0; }
  for m in ${1:-smollm2 gemma}; do
    LLAMAPLUG_NATIVE_TOOLS=$NATIVE LD_LIBRARY_PATH=$(nvidia_libs) timeout 250 $PY bench/run.py --backend cuda \
        --models "$m" --threads 8 --no-peer --repeat 3 --out "$OUT/bench-cuda-$m.json" > "$OUT/bench-cuda-$m.txt" 2>&1
    tail -20 "$OUT/bench-cuda-$m.txt"
  done
}

phase_ray() {
  mkdir -p "$OUT"; cd "$REPO"
  [ -n "$DRY" ] && { echo "ray: DRY_RUN, skipped (16 cores there, 2 here)"; return 0; }
  $PY -c 'import ray' 2>/dev/null || { echo "ray: not installed (the kit's ray pieces were not carried)"; return 0; }
  timeout 240 $PY bench/ray_serve.py --rounds 1 > "$OUT/ray.txt" 2>&1; tail -15 "$OUT/ray.txt"
}

case "${1:-}" in
stash)
  mkdir -p "$W/pieces" && cp -a "$2" "$W/pieces/" && echo "stash: $(basename "$2"), $(ls "$W/pieces" | wc -l) piece(s) here"
  ;;
install) phase_install ;;
test) phase_test ;;
bench) shift; phase_bench "$@" ;;
ray) phase_ray ;;
all)
  t0=$(date +%s)
  phase_install || exit 1
  phase_test; phase_bench; phase_ray
  echo "all: $(( $(date +%s) - t0 )) s"
  ;;
*)
  echo "usage: $0 stash DIR|install|test|bench [models]|ray|all   (DRY_RUN=1: the CPU-only paths)" >&2; exit 2
  ;;
esac
