"""scripts/fill_sim.py replays the runtime's fill in numpy: docs/maps.md's offline measurements rest on it."""
import sys

import numpy as np

from conftest import ROOT, n_threads

sys.path.insert(0, str(ROOT / "scripts"))
import fill_sim  # noqa: E402


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = fill_sim.log_softmax(p_logits), fill_sim.log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def test_fill_sim_replays_the_runtime(smollm2, maps20, prose_tokens):
    """With exact K/V the numpy tail reproduces the fork's layer inputs; with a map file its tail logits are the
    runtime's RidgeFill logits, far closer to them than the fill moves the logits."""
    import ridgefill
    from ridgefill.calibrate import LayerInputs
    from ridgefill.ggufio import read_maps
    toks, tail, s = prose_tokens[:600], 100, 20
    sink = read_maps(maps20).sink_tokens
    model = fill_sim.NumpyLlama(str(smollm2))
    runner = LayerInputs(smollm2, list(range(model.n_layer)), 640, n_threads())
    acts = runner.run(np.asarray(toks, dtype=np.int32))
    del runner
    v = fill_sim.parse_variant(str(maps20))
    sim_exact, got, check = fill_sim.run_prompt(model, s, acts, tail, sink, [v])
    assert check < 0.03                                       # numpy vs ggml arithmetic (Q4_1 weights)

    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=tail, n_ctx=640, n_batch=640,
                          n_ubatch=640, n_threads=n_threads(), n_threads_batch=n_threads(), verbose=False,
                          guard=False)
    llm.set_ridgefill(False)
    rt_exact = llm.prompt_logits(toks, len(toks) - tail)
    llm.set_ridgefill(True)
    rt_fill = llm.prompt_logits(toks, len(toks) - tail)
    assert llm.ridgefill_counts() == (len(toks) - tail - sink, tail + sink)
    fill_effect = _kl(rt_exact, rt_fill)
    assert fill_effect > 1e-3                                  # the fill moves the logits measurably
    assert _kl(rt_exact, sim_exact) < 0.2 * fill_effect        # the numpy model is the fork's ...
    assert _kl(rt_fill, got[v.name]) < 0.2 * fill_effect       # ... and so is its fill
    assert abs(_kl(sim_exact, got[v.name]) - fill_effect) < 0.25 * fill_effect


def test_fill_sim_variants_parse():
    vs, bases = fill_sim.parse_variants(["input-c1", "input-c1@k17-18+v20+m21", "mix8-kv-c0"])
    assert [b.name for b in bases] == ["input-c1", "mix8-kv-c0"]
    assert vs[1].base is vs[0] and vs[1].exact_k == {17, 18} and vs[1].exact_v == {20} and vs[1].hidden == {21}
    assert (vs[2].kind, vs[2].C, vs[2].mix) == ("kv", 0, 8)
