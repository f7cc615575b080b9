"""A layer's own K/V projections in numpy: the targets of K/V maps and the calibration diagnostics.

K/V are what the cache keeps, so map quality is judged on them too.  RoPE is
left out: it rotates k̂ and k of the same position alike, so norms and errors
are unchanged by it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from .errors import RidgefillError
from .ggufio import field_value


@dataclass
class KVWeights:
    attn_norm: np.ndarray            # (d,)
    wk: np.ndarray                   # (n_kv*hd, d)
    wv: np.ndarray                   # (n_kv*hd_v, d)
    bk: np.ndarray | None
    bv: np.ndarray | None
    k_norm: np.ndarray | None        # (hd,), per-head RMS norm after the projection (qwen3, gemma3)
    n_head_kv: int
    eps: float


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def load(reader: GGUFReader, layers: list[int]) -> dict[int, KVWeights]:
    arch = field_value(reader, "general.architecture")
    eps = float(field_value(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))
    n_kv = field_value(reader, f"{arch}.attention.head_count_kv")
    tensors = {t.name: t for t in reader.tensors}

    def get(name):
        t = tensors.get(name)
        return None if t is None else dequantize(t.data, t.tensor_type).astype(np.float32)

    out = {}
    for l in layers:
        wk, wv = get(f"blk.{l}.attn_k.weight"), get(f"blk.{l}.attn_v.weight")
        if wk is None or wv is None:
            raise RidgefillError(f"layer {l}: K/V maps and diagnostics need separate attn_k/attn_v weights")
        n_kv_l = int(n_kv[l] if isinstance(n_kv, list) else n_kv)
        out[l] = KVWeights(get(f"blk.{l}.attn_norm.weight"), wk, wv, get(f"blk.{l}.attn_k.bias"),
                           get(f"blk.{l}.attn_v.bias"), get(f"blk.{l}.attn_k_norm.weight"), n_kv_l, eps)
    return out


def project(w: KVWeights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, d) layer inputs -> k (n, n_kv, hd), v (n, n_kv*hd_v)."""
    xn = rms_norm(x.astype(np.float32), w.attn_norm, w.eps)
    k = xn @ w.wk.T + (w.bk if w.bk is not None else 0)
    v = xn @ w.wv.T + (w.bv if w.bv is not None else 0)
    k = k.reshape(len(x), w.n_head_kv, -1)
    if w.k_norm is not None:
        k = rms_norm(k, w.k_norm, w.eps)
    return k, v


def predicted(w: KVWeights, map_kind: str, W: np.ndarray, b: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The K/V one layer's map (W, b as stored in a map file) gives for features f (n, D): kv maps predict them
    directly (the K heads, then V), input maps predict the layer input, which goes through the projections."""
    y = f.astype(np.float32) @ W.T + b
    if map_kind != "kv":
        return project(w, y)
    dk = w.wk.shape[0]
    return y[:, :dk].reshape(len(f), w.n_head_kv, -1), y[:, dk:]


def kv_errors(w: KVWeights, x_hat: np.ndarray, x: np.ndarray) -> tuple[float, float, float]:
    """(‖k̂−k‖/‖k‖, ‖v̂−v‖/‖v‖, mean over tokens and heads of ‖k̂_h‖/‖k_h‖)."""
    kh, vh = project(w, x_hat)
    k, v = project(w, x)
    k_err = float(np.linalg.norm(kh - k) / np.linalg.norm(k))
    v_err = float(np.linalg.norm(vh - v) / np.linalg.norm(v))
    ratio = float((np.linalg.norm(kh, axis=-1) / np.maximum(np.linalg.norm(k, axis=-1), 1e-30)).mean())
    return k_err, v_err, ratio
