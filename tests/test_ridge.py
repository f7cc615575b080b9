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
