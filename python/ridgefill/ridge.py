"""Ridge maps from streamed moments: the whole algorithm of `ridgefill calibrate`.

For late layer l, predict its input x_l from h (the input of the split layer):

    x̂_l = W_l h + b_l,   min Σ‖x_l − W_l h − b_l‖² + λ‖W_l − P‖²,   P = 0 or I.

With centred moments A = Σ(h−μ_h)(h−μ_h)ᵀ and B_l = Σ(h−μ_h)(x_l−μ_l)ᵀ the
solution is  W_lᵀ = (A + λI)⁻¹ (B_l + λPᵀ),  b_l = μ_l − W_l μ_h.  A is the same
for every layer, so one Cholesky factor serves all of them.  λ is given relative
to the mean eigenvalue of A: λ_abs = λ · trace(A)/d, so it does not depend on
the number of calibration tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg

LAMBDA_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
PRIORS = ("zero", "identity")


@dataclass
class Moments:
    """Running float64 sums over tokens of h and of each late-layer input x_l (L layers, width d)."""
    d: int
    L: int
    n: int = 0
    sh: np.ndarray = field(init=False)   # Σ h            (d,)
    shh: np.ndarray = field(init=False)  # Σ h hᵀ         (d, d)
    sx: np.ndarray = field(init=False)   # Σ x_l          (L, d)
    shx: np.ndarray = field(init=False)  # Σ h x_lᵀ       (L, d, d)
    sxx: np.ndarray = field(init=False)  # Σ ‖x_l‖²       (L,)

    def __post_init__(self):
        d, L = self.d, self.L
        self.sh, self.shh = np.zeros(d), np.zeros((d, d))
        self.sx, self.shx, self.sxx = np.zeros((L, d)), np.zeros((L, d, d)), np.zeros(L)

    def add(self, h: np.ndarray, xs: np.ndarray) -> None:
        """h: (n, d) inputs of the split layer; xs: (L, n, d) inputs of the late layers, same tokens."""
        h = np.asarray(h, dtype=np.float64)
        self.n += h.shape[0]
        self.sh += h.sum(0)
        self.shh += h.T @ h
        for l in range(self.L):
            x = np.asarray(xs[l], dtype=np.float64)
            self.sx[l] += x.sum(0)
            self.shx[l] += h.T @ x
            self.sxx[l] += np.einsum("ij,ij->", x, x)

    def is_finite(self) -> bool:
        return all(np.isfinite(a).all() for a in (self.sh, self.shh, self.sx, self.shx, self.sxx))


def solve(m: Moments, lam: float | np.ndarray, prior: str = "identity") -> tuple[np.ndarray, np.ndarray]:
    """Closed-form ridge maps for every late layer: W (L, d, d) with x̂ = W h + b, b (L, d)."""
    mu_h, mu_x = m.sh / m.n, m.sx / m.n
    A = m.shh - m.n * np.outer(mu_h, mu_h)
    B = m.shx - m.n * mu_h[None, :, None] * mu_x[:, None, :]   # (L, d_in, d_out)
    lams = np.broadcast_to(np.asarray(lam, dtype=np.float64), (m.L,))
    P = np.eye(m.d) if prior == "identity" else np.zeros((m.d, m.d))
    W = np.empty((m.L, m.d, m.d))
    scale = np.trace(A) / m.d
    for lam_rel in np.unique(lams):                            # one Cholesky per distinct λ
        chol = scipy.linalg.cho_factor(A + lam_rel * scale * np.eye(m.d))
        for l in np.flatnonzero(lams == lam_rel):
            W[l] = scipy.linalg.cho_solve(chol, B[l] + lam_rel * scale * P.T).T
    b = mu_x - np.einsum("lij,j->li", W, mu_h)
    return W, b


def sse(m: Moments, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ‖x_l − W_l h − b_l‖² over the tokens summed in m, per layer, from the moments alone."""
    out = np.empty(m.L)
    for l in range(m.L):
        Wl, bl = W[l], b[l]
        out[l] = (m.sxx[l] - 2 * np.einsum("ij,ji->", Wl, m.shx[l]) - 2 * bl @ m.sx[l]
                  + np.einsum("ij,ij->", Wl @ m.shh, Wl) + 2 * bl @ (Wl @ m.sh) + m.n * bl @ bl)
    return np.maximum(out, 0.0)


def sst(m: Moments) -> np.ndarray:
    """Σ‖x_l − mean‖², per layer (the denominator of R²)."""
    return m.sxx - np.einsum("li,li->l", m.sx, m.sx) / m.n


def pick_lambda(train: Moments, val: Moments, prior: str, grid=LAMBDA_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer λ from `grid` with the smallest held-out error; returns (λ per layer, errors (grid, L))."""
    errs = np.stack([sse(val, *solve(train, lam, prior)) for lam in grid])
    return np.asarray(grid)[errs.argmin(0)], errs
