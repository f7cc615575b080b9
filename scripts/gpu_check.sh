#!/usr/bin/env bash
# The GPU check, one prepared script (see docs/scale.md, "GPU").
#
#   bash scripts/gpu_check.sh kit   KIT [WHEEL] # here, online: what an offline GPU machine needs (~20 MB);
#                                               # with WHEEL (a CUDA wheel built here), the wheel instead of the tree
#                                               # (52 MiB in all for an sm_90 wheel: fits a 64 MiB carry)
#   bash scripts/gpu_check.sh build KIT        # there: CUDA build of the fork into .gpusite, timed (offline)
#   bash scripts/gpu_check.sh install KIT      # there: install the kit's wheel into .gpusite instead of building
#   bash scripts/gpu_check.sh run   KIT [OUT]  # there: CPU vs GPU checks + TTFT table (scripts/gpu_check.py)
#   bash scripts/gpu_check.sh all   KIT [OUT]  # build, then run
#   bash scripts/gpu_check.sh smoke KIT [OUT]  # here, CPU only: runs the checks' code at toy sizes (on .gpusite
#                                               # if build/install made one, else on .venv)
#
# The kit holds the pinned upstream tree (unpacked and verified here; the GPU machine cannot download it, and
# the 77 MB sdist would not fit a 64 MiB carry, so docs/, models/, tests/ and benches/ are left out of it),
# wheels the machine's image lacks, Shakespeare (prompts, calibration text) and SmolLM2's tokenizer for the
# synthetic shapes (~35 MB in all).  `run` makes three tiny random-weight models (llama, qwen3, gemma3 graphs),
# calibrates maps on them, and writes the zero-weight 1B/8B shapes with random maps for the timings.
# The build takes cuBLAS from the image's nvidia-cublas wheel (or RIDGEFILL_CUBLAS_ROOT) and builds for the
# GPU it sees (CMAKE_CUDA_ARCHITECTURES=native unless set).  Keep KIT inside the checkout, ignored by git, to
# carry it: e.g. KIT=gpu-kit with `gpu-kit/` in .git/info/exclude.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; KIT="${2:-}"; OUT="${3:-${OUT:-gpu-check-out}}"
[ -n "$cmd" ] && [ -n "$KIT" ] || { sed -n '2,12p' "$0"; exit 2; }
mkdir -p "$KIT"; KIT="$(cd "$KIT" && pwd)"
PRISTINE=pristine-832db0699007f1be

kit() {
    local py="$ROOT/.venv/bin/python" cache="${RIDGEFILL_CACHE:-$HOME/.cache/ridgefill}" wheel="${1:-}"
    mkdir -p "$KIT/wheels" "$KIT/cache/data"
    if [ -n "$wheel" ]; then  # a CUDA wheel built here (47 MB for sm_90): no tree, no build there
        rm -f "$KIT/upstream.tar.xz" "$KIT"/wheels/llama_cpp_python-*.whl
        cp "$wheel" "$KIT/wheels/"
    else
        [ -d "$cache/upstream/$PRISTINE" ] || { echo "gpu_check: build the fork here first (scripts/setup.sh)"; exit 1; }
        local L='*/vendor/llama.cpp'
        tar -C "$cache/upstream" -cJf "$KIT/upstream.tar.xz" --exclude='*/.git' --exclude="$L/docs" \
            --exclude="$L/models" --exclude="$L/tests" --exclude="$L/benches" --exclude="$L/examples" \
            --exclude="$L/conversion" --exclude="$L/tools/ui/tests" --exclude="$L/tools/mtmd/test-*" \
            --exclude="$L/vendor/miniaudio" --exclude="$L/ggml/src/ggml-opencl" --exclude="$L/ggml/src/ggml-vulkan" \
            --exclude="$L/ggml/src/ggml-sycl" --exclude="$L/ggml/src/ggml-hexagon" "$PRISTINE"
    fi
    "$py" -m pip download -q --no-deps -d "$KIT/wheels" "gguf==$("$py" -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
        diskcache
    cp "$cache/data/shakespeare.jsonl" "$KIT/cache/data/"
    "$py" "$ROOT/scripts/make_synthetic.py" --tokenizer-only -o "$KIT/tokenizer.gguf"
    du -sh "$KIT"
}

tiny_models() {  # three tiny random-weight models (llama, qwen3, gemma3 graphs) and maps calibrated on them
    local py="$1" dir="$KIT/models"
    mkdir -p "$dir"
    for arch in llama qwen3 gemma3; do
        [ -f "$dir/tiny-$arch.maps.gguf" ] && continue
        "$py" "$ROOT/scripts/make_synthetic.py" "tiny-$arch" -o "$dir/tiny-$arch.gguf" --type q8_0
        "$py" -m ridgefill calibrate "$dir/tiny-$arch.gguf" --split-layer 3 --corpus shakespeare --tokens 4096 \
            --ctx 512 --no-progress -o "$dir/tiny-$arch.maps.gguf" > /dev/null
    done
}

env_for_kit() {
    export RIDGEFILL_CACHE="$KIT/cache" RIDGEFILL_TOKENIZER_GGUF="$KIT/tokenizer.gguf"
    [ -f "$KIT/upstream.tar.xz" ] || return 0  # a wheel kit
    if [ ! -f "$KIT/cache/upstream/$PRISTINE/.complete" ]; then
        mkdir -p "$KIT/cache/upstream" && tar -C "$KIT/cache/upstream" -xJf "$KIT/upstream.tar.xz"
        echo "pruned for gpu_check (docs, models, tests, benches, examples, conversion left out)" \
            > "$KIT/cache/upstream/$PRISTINE/.complete"
    fi
}

# The fork goes into $SITE, layered over the machine's own python3 (PYTHONPATH): on this project's GPU image
# python3 is itself a venv (PyTorch's), whose numpy/scipy/cuBLAS a venv made from it would not see.
SITE="$ROOT/.gpusite"
PY="${PY:-python3}"

deps() {
    "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$KIT"/wheels/gguf-*.whl \
        "$KIT"/wheels/diskcache-*.whl
}

build() {
    env_for_kit
    deps
    if [ -z "${RIDGEFILL_CUBLAS_ROOT:-}" ] && ! ls /usr/local/cuda/lib64/libcublas.so* >/dev/null 2>&1; then
        RIDGEFILL_CUBLAS_ROOT="$("$PY" -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' 2>/dev/null \
            || "$PY" -c 'import nvidia, os, glob; print(sorted(g for p in nvidia.__path__ for g in glob.glob(os.path.join(p, "cu*")))[-1])')"
        export RIDGEFILL_CUBLAS_ROOT
        echo "cuBLAS from $RIDGEFILL_CUBLAS_ROOT"
    fi
    local t0; t0=$(date +%s)
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-native} ${CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$PY" -m pip install --no-index --no-build-isolation --no-deps --upgrade --target "$SITE" \
        -C build-dir=build/gpu "$ROOT" > "$ROOT/build/gpu-install.log" 2>&1 \
        || { tail -n 40 "$ROOT/build/gpu-install.log"; exit 1; }
    echo "gpu_check: CUDA build and install took $(( $(date +%s) - t0 )) s on $(nproc) cores"
}

install_wheel() {  # the kit's CUDA wheel, built elsewhere, instead of `build`
    env_for_kit
    local wheel
    wheel=$(ls "$KIT"/wheels/llama_cpp_python-*.whl 2>/dev/null | head -n 1)
    [ -n "$wheel" ] || { echo "gpu_check: $KIT holds no wheel (make it with: gpu_check.sh kit KIT WHEEL)"; exit 1; }
    deps
    "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$wheel"
    echo "gpu_check: installed $(basename "$wheel") into $SITE"
}

use_site() {  # the fork first on the path; cuBLAS/cudart wherever the machine's nvidia-* wheels put them
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    local d
    d=$("$PY" -c 'import nvidia, os, glob; print(":".join(sorted(g for p in nvidia.__path__ for g in glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null) || true
    [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    return 0
}

run() {
    env_for_kit
    use_site
    nvidia-smi -L || true
    tiny_models "$PY"
    "$PY" "$ROOT/scripts/gpu_check.py" --models "$KIT/models" --out "$OUT" "$@"
}

case "$cmd" in
    kit) kit "${3:-}" ;;
    build) mkdir -p "$ROOT/build"; build ;;
    install) install_wheel ;;
    run) run ;;
    all) mkdir -p "$ROOT/build"; build; run ;;
    smoke) env_for_kit  # on what `build`/`install` put in .gpusite (with $PY), else on .venv
           if [ -d "$SITE" ]; then use_site; else PY="$ROOT/.venv/bin/python"; fi
           tiny_models "$PY"; "$PY" "$ROOT/scripts/gpu_check.py" --models "$KIT/models" --out "$OUT" --smoke ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
esac
