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
