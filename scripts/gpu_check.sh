#!/usr/bin/env bash
# The GPU check, one prepared script (see docs/scale.md, "GPU").
#
#   bash scripts/gpu_check.sh kit   KIT        # here, online: what an offline GPU machine needs (~20 MB)
#   bash scripts/gpu_check.sh build KIT        # there: CUDA build of the fork into .gpuvenv, timed (offline)
#   bash scripts/gpu_check.sh run   KIT [OUT]  # there: CPU vs GPU checks + TTFT table (scripts/gpu_check.py)
#   bash scripts/gpu_check.sh all   KIT [OUT]  # build, then run
#   bash scripts/gpu_check.sh smoke KIT [OUT]  # here, CPU only: runs the checks' code at toy sizes
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
[ -n "$cmd" ] && [ -n "$KIT" ] || { sed -n '2,8p' "$0"; exit 2; }
mkdir -p "$KIT"; KIT="$(cd "$KIT" && pwd)"
PRISTINE=pristine-832db0699007f1be

kit() {
    local py="$ROOT/.venv/bin/python" cache="${RIDGEFILL_CACHE:-$HOME/.cache/ridgefill}"
    [ -d "$cache/upstream/$PRISTINE" ] || { echo "gpu_check: build the fork here first (scripts/setup.sh)"; exit 1; }
    local L='*/vendor/llama.cpp'
    tar -C "$cache/upstream" -cJf "$KIT/upstream.tar.xz" --exclude='*/.git' --exclude="$L/docs" \
        --exclude="$L/models" --exclude="$L/tests" --exclude="$L/benches" --exclude="$L/examples" \
        --exclude="$L/conversion" --exclude="$L/tools/ui/tests" --exclude="$L/tools/mtmd/test-*" \
        --exclude="$L/vendor/miniaudio" --exclude="$L/ggml/src/ggml-opencl" --exclude="$L/ggml/src/ggml-vulkan" \
        --exclude="$L/ggml/src/ggml-sycl" --exclude="$L/ggml/src/ggml-hexagon" "$PRISTINE"
    mkdir -p "$KIT/wheels" "$KIT/cache/data"
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
    if [ ! -f "$KIT/cache/upstream/$PRISTINE/.complete" ]; then
        mkdir -p "$KIT/cache/upstream" && tar -C "$KIT/cache/upstream" -xJf "$KIT/upstream.tar.xz"
        echo "pruned for gpu_check (docs, models, tests, benches, examples, conversion left out)" \
            > "$KIT/cache/upstream/$PRISTINE/.complete"
    fi
}

build() {
    env_for_kit
    local venv="$ROOT/.gpuvenv" py=python3
    [ -x "$venv/bin/python" ] || "$py" -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install -q --no-index --find-links "$KIT/wheels" gguf diskcache
    if [ -z "${RIDGEFILL_CUBLAS_ROOT:-}" ] && ! ls /usr/local/cuda/lib64/libcublas.so* >/dev/null 2>&1; then
        RIDGEFILL_CUBLAS_ROOT="$("$venv/bin/python" -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' 2>/dev/null \
            || "$venv/bin/python" -c 'import nvidia, os, glob; print(sorted(glob.glob(os.path.join(nvidia.__path__[0], "cu*")))[-1])')"
        export RIDGEFILL_CUBLAS_ROOT
        echo "cuBLAS from $RIDGEFILL_CUBLAS_ROOT"
    fi
    local t0; t0=$(date +%s)
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-native} ${CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$venv/bin/python" -m pip install --no-index --no-build-isolation --no-deps \
        -C build-dir=build/gpu "$ROOT" > "$ROOT/build/gpu-install.log" 2>&1 \
        || { tail -n 40 "$ROOT/build/gpu-install.log"; exit 1; }
    echo "gpu_check: CUDA build and install took $(( $(date +%s) - t0 )) s on $(nproc) cores"
}

run() {
    env_for_kit
    local py="$ROOT/.gpuvenv/bin/python"
    nvidia-smi -L || true
    tiny_models "$py"
    "$py" "$ROOT/scripts/gpu_check.py" --models "$KIT/models" --out "$OUT" "$@"
}

case "$cmd" in
    kit) kit ;;
    build) mkdir -p "$ROOT/build"; build ;;
    run) run ;;
    all) mkdir -p "$ROOT/build"; build; run ;;
    smoke) env_for_kit; tiny_models "$ROOT/.venv/bin/python"
           "$ROOT/.venv/bin/python" "$ROOT/scripts/gpu_check.py" --models "$KIT/models" --out "$OUT" --smoke ;;
    *) sed -n '2,8p' "$0"; exit 2 ;;
esac
