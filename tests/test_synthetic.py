"""Synthetic models of real shapes (random weights: speed, memory and plumbing only, never quality)."""
import numpy as np
import pytest
from conftest import logits_last, n_threads
from gguf import GGMLQuantizationType, GGUFReader

from ridgefill import synthetic
from ridgefill.bench import Shape
from ridgefill.ggufio import field_value, read_maps
from ridgefill.modelfile import open_gguf

PROMPT = b"The committee met on Tuesday to discuss the budget for the coming year, and then adjourned. " * 12
TINY_TYPES = {"tiny-llama": "q8_0", "tiny-qwen3": "q4_0", "tiny-gemma3": "f16"}   # every writable type once


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    return {name: synthetic.write(name, out / f"{name}.gguf", t) for name, t in TINY_TYPES.items()}


@pytest.mark.parametrize("name", list(TINY_TYPES))
def test_tiny_shapes_load_and_give_finite_logits(tiny, name):
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as C
    spec = synthetic.SPECS[name]
    llm = Llama(model_path=str(tiny[name]), n_ctx=512, n_threads=n_threads(), verbose=False)
    s = spec.shape
    assert (C.llama_model_n_layer(llm.model), llm.n_embd(), llm.n_vocab()) == (s.n_layer, s.d, s.n_vocab)
    if spec.swa:
        assert llm.metadata["gemma3.attention.sliding_window"] == str(spec.swa[0])
    tokens = llm.tokenize(PROMPT)
    assert len(tokens) > 2 * 64                              # past tiny-gemma3's 64-token window
    llm.eval(tokens)
    logits = logits_last(llm)
    assert np.isfinite(logits).all() and 0.3 < logits.std() < 3, logits.std()


def test_a_tiny_calibration_runs_and_its_maps_weigh_maps_bytes(tiny, tmp_path):
    import ridgefill
    from ridgefill.calibrate import CalibConfig, calibrate
    model, maps = tiny["tiny-llama"], tmp_path / "maps.gguf"
    m = calibrate(CalibConfig(model=model, split_layer=2, corpus="brown", tokens=1024, ctx=256, map_type="q8_0",
                              threads=n_threads(), progress=False), maps)
    assert m.late_layers == [3, 4, 5] and np.isfinite(m.diagnostics["r2"]).all()
    assert {"forward_s", "moments_s", "solve_s", "diagnostics_s", "write_s"} <= set(m.extra)
    expected = synthetic.maps_bytes(synthetic.SPECS["tiny-llama"].shape, 2, "q8_0")
    assert expected == 3 * (256 * 256 // 32 * 34 + 4 * 256)
    assert sum(int(t.n_bytes) for t in GGUFReader(maps).tensors) == expected
    assert 0 < maps.stat().st_size - expected < 64 * 1024      # the rest is the header: keys and diagnostics
    assert read_maps(maps).split_layer == 2
    # the runtime takes them: plumbing only, random weights say nothing of quality
    llm = ridgefill.Llama(str(model), maps_path=str(maps), tail_tokens=64, n_ctx=512, n_threads=n_threads(),
                          verbose=False, guard=False)  # the fill itself: a guard score means nothing on random weights
    tokens = llm.tokenize(PROMPT)
    llm.eval(tokens)
    assert llm.ridgefill_counts() == (len(tokens) - 64 - m.sink_tokens, 64 + m.sink_tokens)
    assert np.isfinite(logits_last(llm)).all()


def test_the_1b_shape_has_the_published_tensors_and_keys(tmp_path):
    spec = synthetic.SPECS["llama-3.2-1b"]
    path = synthetic.write(spec, tmp_path / "m.gguf", "q4_0", weights=False)   # header only: a sparse file
    s = Shape.of(path)
    assert s == spec.shape == Shape(16, 2048, 32, 8, 64, 8192, 128256, 131072)
    r = open_gguf(path)
    assert [(t.name, tuple(int(n) for n in t.shape[::-1]), t.tensor_type) for t in r.tensors] == \
           [(t.name, t.shape, t.qtype) for t in synthetic.tensor_plan(spec, "q4_0")]
    assert sum(int(t.n_bytes) for t in r.tensors) == synthetic.model_bytes(spec, "q4_0")
    assert sum(int(np.prod(t.shape)) for t in r.tensors) == 1_235_814_400 + 32   # + rope_freqs, as converted
    names = {t.name for t in r.tensors}
    assert "rope_freqs.weight" in names and "output.weight" not in names          # llama3 RoPE, tied head
    assert (field_value(r, "general.architecture"), field_value(r, "llama.context_length"),
            field_value(r, "llama.vocab_size"), field_value(r, "general.file_type")) == ("llama", 131072, 128256, 2)
    assert field_value(r, "llama.rope.freq_base") == 500000.0                     # file type 2: MOSTLY_Q4_0
    assert field_value(r, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert "never quality" in field_value(r, "general.description")
    tokens = r.get_field("tokenizer.ggml.tokens")
    assert len(tokens.data) == 128256 and bytes(tokens.parts[tokens.data[-1]]) == b"[PAD128255]"


def test_llama3_rope_factors_and_maps_bytes():
    f = synthetic.llama3_rope_factors(64, 500000.0, 32.0, 1.0, 4.0, 8192)
    assert f.shape == (32,) and f[0] == 1.0 and f[-1] == 32.0 and np.all(np.diff(f) >= 0)
    s8 = synthetic.SPECS["llama-3.1-8b"].shape
    assert synthetic.maps_bytes(s8, 16, "f32") == 15 * (4096 * 4096 * 4 + 4096 * 4)
    assert synthetic.maps_bytes(s8, 16, "q8_0") == 15 * (4096 * 4096 * 34 // 32 + 4096 * 4)
    assert synthetic.tensor_nbytes((4096, 4096), GGMLQuantizationType.Q4_0) == 4096 * 4096 * 18 // 32
    with pytest.raises(Exception, match="split layer 32"):
        synthetic.maps_bytes(s8, 32, "q8_0")
