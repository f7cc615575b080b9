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


def layer_maps(m: Moments, lam: float | np.ndarray, prior: str = "identity"):
    """Closed-form ridge maps one late layer at a time: yields (l, W_l (d, d), b_l (d,)) in float64.

    Only one layer's d×d temporaries exist at a time (plus one Cholesky factor per distinct λ), so
    memory does not grow with the number of late layers beyond the moments themselves.
    """
    mu_h, mu_x = m.sh / m.n, m.sx / m.n
    lams = np.broadcast_to(np.asarray(lam, dtype=np.float64), (m.L,))
    A = m.shh - m.n * np.outer(mu_h, mu_h)
    scale = np.trace(A) / m.d
    diag = np.diag_indices(m.d)
    for lam_rel in np.unique(lams):                            # one Cholesky per distinct λ
        lam_abs = lam_rel * scale
        reg = A.copy()
        reg[diag] += lam_abs
        chol = scipy.linalg.cho_factor(reg, overwrite_a=True)
        for l in np.flatnonzero(lams == lam_rel):
            rhs = m.shx[l] - (m.n * mu_h)[:, None] * mu_x[l][None, :]   # B_l (d_in, d_out)
            if prior == "identity":
                rhs[diag] += lam_abs                           # B_l + λPᵀ
            W = scipy.linalg.cho_solve(chol, rhs, overwrite_b=True).T
            yield l, W, mu_x[l] - W @ mu_h


def solve(m: Moments, lam: float | np.ndarray, prior: str = "identity",
          dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form ridge maps for every late layer: W (L, d, d) with x̂ = W h + b, b (L, d).

    W is stored in `dtype` (calibrate asks for float32, the type maps are written in: half the memory);
    each layer is solved in float64 and b from the float64 W.
    """
    W, b = np.empty((m.L, m.d, m.d), dtype=dtype), np.empty((m.L, m.d))
    for l, Wl, bl in layer_maps(m, lam, prior):
        W[l], b[l] = Wl, bl
    return W, b


def sse_layer(m: Moments, l: int, W: np.ndarray, b: np.ndarray) -> float:
    """Σ‖x_l − W h − b‖² over the tokens summed in m, for late layer l, from the moments alone."""
    W = np.asarray(W, dtype=np.float64)
    out = (m.sxx[l] - 2 * np.einsum("ij,ji->", W, m.shx[l]) - 2 * b @ m.sx[l]
           + np.einsum("ij,ij->", W @ m.shh, W) + 2 * b @ (W @ m.sh) + m.n * b @ b)
    return max(float(out), 0.0)


def sse(m: Moments, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ‖x_l − W_l h − b_l‖² over the tokens summed in m, per layer, from the moments alone."""
    return np.array([sse_layer(m, l, W[l], b[l]) for l in range(m.L)])


def sse_identity(m: Moments) -> np.ndarray:
    """Σ‖x_l − h‖² per layer: the error of the identity baseline x̂_l = h, in O(L·d)."""
    return np.maximum(m.sxx - 2 * np.trace(m.shx, axis1=1, axis2=2) + np.trace(m.shh), 0.0)


def sst(m: Moments) -> np.ndarray:
    """Σ‖x_l − mean‖², per layer (the denominator of R²)."""
    return m.sxx - np.einsum("li,li->l", m.sx, m.sx) / m.n


def pick_lambda(train: Moments, val: Moments, prior: str, grid=LAMBDA_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer λ from `grid` with the smallest held-out error; returns (λ per layer, errors (grid, L)).

    Maps are solved and scored one layer at a time and never kept: memory stays that of the moments.
    """
    errs = np.empty((len(grid), train.L))
    for i, lam in enumerate(grid):
        for l, W, b in layer_maps(train, lam, prior):
            errs[i, l] = sse_layer(val, l, W, b)
    return np.asarray(grid)[errs.argmin(0)], errs
