"""The closed-form ridge solve against an independent solution on the same (real) data."""
import numpy as np
import pytest
from conftest import n_threads

from ridgefill import ridge
from ridgefill.calibrate import LayerInputs


@pytest.fixture(scope="module")
def activations(smollm2):
    """Real inputs of layers 20 (h) and 21, 25, 29 (x_l) for 300 tokens of text."""
    runner = LayerInputs(smollm2, [20, 21, 25, 29], ctx=512, threads=n_threads())
    text = "The committee met on Tuesday to discuss the budget for the coming year. " * 30
    toks = np.asarray(runner.bos + runner.tokenize(text)[:299], dtype=np.int32)
    acts = runner.run(toks).astype(np.float64)[:, 4:]
    return acts[0], acts[1:]


@pytest.mark.parametrize("prior", ["zero", "identity"])
@pytest.mark.parametrize("lam", [1e-3, 1e-1])
def test_solve_matches_lstsq_on_an_augmented_system(activations, prior, lam):
    h, xs = activations
    m = ridge.Moments(h.shape[1], len(xs))
    m.add(h[:150], xs[:, :150])           # streamed in two parts
    m.add(h[150:], xs[:, 150:])
    W, b = ridge.solve(m, lam, prior)

    hc = h - h.mean(0)
    lam_abs = lam * np.trace(hc.T @ hc) / h.shape[1]
    P = np.eye(h.shape[1]) if prior == "identity" else np.zeros((h.shape[1],) * 2)
    for l, x in enumerate(xs):
        # min ‖Hc Wᵀ − Xc‖² + λ‖W − P‖²  ==  lstsq of [Hc; √λ I] Wᵀ = [Xc; √λ Pᵀ]
        A = np.vstack([hc, np.sqrt(lam_abs) * np.eye(h.shape[1])])
        B = np.vstack([x - x.mean(0), np.sqrt(lam_abs) * P.T])
        Wt = np.linalg.lstsq(A, B, rcond=None)[0]
        np.testing.assert_allclose(W[l], Wt.T, rtol=1e-6, atol=1e-8 * np.abs(Wt).max())
        np.testing.assert_allclose(b[l], x.mean(0) - Wt.T @ h.mean(0), rtol=1e-6, atol=1e-6)
        direct = ((x - h @ W[l].T - b[l]) ** 2).sum()
        np.testing.assert_allclose(ridge.sse(m, W, b)[l], direct, rtol=1e-7)


def test_identity_prior_tends_to_identity(activations):
    h, xs = activations
    m = ridge.Moments(h.shape[1], len(xs))
    m.add(h, xs)
    W, _ = ridge.solve(m, 1e8, "identity")
    np.testing.assert_allclose(W[0], np.eye(h.shape[1]), atol=1e-5)
    W0, _ = ridge.solve(m, 1e8, "zero")
    assert np.abs(W0).max() < 1e-5


def test_layer_by_layer_solve_and_search_match_the_dense_formulas():
    """pick_lambda and solve never hold all layers' maps; they give what the dense formulas give."""
    rng = np.random.default_rng(0)
    d, L, n = 48, 4, 300
    h = rng.standard_normal((n, d)) @ (rng.standard_normal((d, d)) * np.exp(-np.arange(d) / 8)) + 2.0
    xs = np.stack([h + 0.2 * h @ rng.standard_normal((d, d)) + 0.3 * rng.standard_normal((n, d)) for _ in range(L)])
    train, val = ridge.Moments(d, L), ridge.Moments(d, L)
    train.add(h[:220], xs[:, :220])
    val.add(h[220:], xs[:, 220:])
    lams, errs = ridge.pick_lambda(train, val, "identity")
    hc, mu = h[:220] - h[:220].mean(0), h[:220].mean(0)
    for i, lam in enumerate(ridge.LAMBDA_GRID):
        lam_abs = lam * np.trace(hc.T @ hc) / d
        for l in range(L):
            x = xs[l, :220]
            W = np.linalg.solve(hc.T @ hc + lam_abs * np.eye(d), hc.T @ (x - x.mean(0)) + lam_abs * np.eye(d)).T
            b = x.mean(0) - W @ mu
            direct = ((xs[l, 220:] - h[220:] @ W.T - b) ** 2).sum()
            np.testing.assert_allclose(errs[i, l], direct, rtol=1e-6)
    W64, b64 = ridge.solve(train, lams, "identity")
    W32, b32 = ridge.solve(train, lams, "identity", dtype=np.float32)
    assert W32.dtype == np.float32 and np.array_equal(W32, W64.astype(np.float32)) and np.array_equal(b32, b64)
    identity = ridge.sse(val, np.broadcast_to(np.eye(d), (L, d, d)), np.zeros((L, d)))
    np.testing.assert_allclose(ridge.sse_identity(val), identity, rtol=1e-10)
    np.testing.assert_allclose(identity, ((xs[:, 220:] - h[220:]) ** 2).sum((1, 2)), rtol=1e-10)


@pytest.fixture(scope="module")
def kv_activations(smollm2):
    """Real split-layer states h (layer 20's input, every position) of 300 tokens of Shakespeare, and the K and
    V of layers 21 and 29 (kv targets K21, V21, K29, V29, width 192) at positions 4.."""
    from ridgefill import data, kvproj
    from ridgefill.calibrate import kv_targets
    from ridgefill.modelfile import open_gguf
    runner = LayerInputs(smollm2, [20, 21, 29], ctx=512, threads=n_threads())
    toks = np.asarray(runner.bos + runner.tokenize(data.text("shakespeare")[:4000])[:299], dtype=np.int32)
    acts = runner.run(toks)
    kvw = kvproj.load(open_gguf(smollm2), [21, 29])
    ys = kv_targets([kvw[21], kvw[29]], acts[1:, 4:], 192)
    return acts[0].astype(np.float64), ys.astype(np.float64)


def test_context_features_are_the_token_then_its_predecessors():
    h = np.arange(12.0).reshape(6, 2)
    f = ridge.context_features(h, 2, start=3)
    np.testing.assert_array_equal(f, [[6, 7, 4, 5, 2, 3], [8, 9, 6, 7, 4, 5], [10, 11, 8, 9, 6, 7]])
    np.testing.assert_array_equal(ridge.context_features(h, 0, 1), h[1:])
    with pytest.raises(ValueError):
        ridge.context_features(h, 2, start=1)


@pytest.mark.parametrize("C", [1, 2])
@pytest.mark.parametrize("lam", [1e-4, 1e-1])
def test_kv_solve_with_context_features_matches_lstsq(kv_activations, C, lam):
    """K/V targets from features [h_t, ..., h_t-C]: the moments' solve equals lstsq on the explicit design [F, 1]
    with the ridge rows appended (intercept not penalised), and sse() equals the direct sum."""
    h, ys = kv_activations
    F = np.stack([np.concatenate([h[t - j] for j in range(C + 1)]) for t in range(4, len(h))])
    np.testing.assert_array_equal(ridge.context_features(h, C, 4), F)
    n, D = F.shape
    m = ridge.Moments(D, len(ys), ys.shape[2])
    m.add(F[:100], ys[:, :100])           # streamed in two parts
    m.add(F[100:], ys[:, 100:])
    W, b = ridge.solve(m, lam, "zero")
    assert W.shape == (4, 192, D) and b.shape == (4, 192)

    Fc = F - F.mean(0)
    lam_abs = lam * np.trace(Fc.T @ Fc) / D
    design = np.vstack([np.hstack([F, np.ones((n, 1))]),
                        np.hstack([np.sqrt(lam_abs) * np.eye(D), np.zeros((D, 1))])])
    errs = ridge.sse(m, W, b)
    targets = np.vstack([np.hstack(list(ys)), np.zeros((D, ys.shape[0] * ys.shape[2]))])   # all four at once
    coefs = np.linalg.lstsq(design, targets, rcond=None)[0].reshape(D + 1, len(ys), -1)
    for l, y in enumerate(ys):
        coef = coefs[:, l]
        np.testing.assert_allclose(W[l], coef[:D].T, rtol=1e-6, atol=1e-6 * np.abs(coef[:D]).max())
        np.testing.assert_allclose(b[l], coef[D], rtol=1e-6, atol=1e-6 * np.abs(coef[D]).max())
        direct = ((y - F @ W[l].T - b[l]) ** 2).sum()   # n < D: near 0 at small λ; sse() cancels to ε·Σ‖y‖²
        np.testing.assert_allclose(errs[l], direct, rtol=1e-6, atol=1e-12 * m.sxx[l])


def test_zero_padded_targets_solve_like_separate_ones():
    """K and V of unequal widths share one Moments with the narrower zero-padded (calibrate.kv_targets): the same
    maps, errors and λ as solving them apart, and the padding's rows are zero."""
    rng = np.random.default_rng(1)
    D, n = 40, 300
    f = rng.standard_normal((n, D)) @ rng.standard_normal((D, D)) + 1.0
    k = f @ rng.standard_normal((D, 12)) + rng.standard_normal((n, 12))
    v = f @ rng.standard_normal((D, 8)) + 3 * rng.standard_normal((n, 8))
    padded = np.zeros((2, n, 12))
    padded[0], padded[1, :, :8] = k, v
    train, val, tk, vk, tv, vv = (ridge.Moments(D, *shape) for shape in [(2, 12)] * 2 + [(1, 12)] * 2 + [(1, 8)] * 2)
    for (t, va), ys in (((train, val), padded), ((tk, vk), k[None]), ((tv, vv), v[None])):
        t.add(f[:200], ys[:, :200])
        va.add(f[200:], ys[:, 200:])
    lams, errs = ridge.pick_lambda(train, val, "zero")
    assert lams[0] == ridge.pick_lambda(tk, vk, "zero")[0][0] and lams[1] == ridge.pick_lambda(tv, vv, "zero")[0][0]
    W, b = ridge.solve(train, lams, "zero")
    Wk, bk = ridge.solve(tk, lams[0], "zero")
    Wv, bv = ridge.solve(tv, lams[1], "zero")
    np.testing.assert_allclose(W[0], Wk[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(W[1, :8], Wv[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b[1, :8], bv[0], rtol=1e-12, atol=1e-12)
    assert not W[1, 8:].any() and not b[1, 8:].any()
    np.testing.assert_allclose(ridge.sse(val, W, b), [ridge.sse(vk, Wk, bk)[0], ridge.sse(vv, Wv, bv)[0]], rtol=1e-10)


def test_identity_prior_with_context_features_is_the_first_block():
    """For input maps with context features the identity prior P = [I, 0, ...] and the identity baseline use h_t."""
    rng = np.random.default_rng(2)
    d, C, n = 16, 2, 200
    h = rng.standard_normal((n, d)) + 0.5
    f = ridge.context_features(h, C, C)
    xs = np.stack([h[C:] + 0.3 * rng.standard_normal((n - C, d)) for _ in range(2)])
    m = ridge.Moments((C + 1) * d, 2, d)
    m.add(f, xs)
    W, _ = ridge.solve(m, 1e8, "identity")
    P = np.hstack([np.eye(d), np.zeros((d, C * d))])
    np.testing.assert_allclose(W[0], P, atol=1e-5)
    np.testing.assert_allclose(ridge.sse_identity(m), ((xs - h[C:]) ** 2).sum((1, 2)), rtol=1e-10)
    wide = ridge.Moments(d, 1, 2 * d)
    wide.add(h, np.hstack([h, h])[None])
    with pytest.raises(ValueError, match="d_out <= d_in"):
        ridge.solve(wide, 1e-2, "identity")
