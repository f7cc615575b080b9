#!/usr/bin/env python3
"""RidgeFill's fill replayed in numpy from exact activations: try map variants before the runtime has them.

The runtime fills the cache of every late layer l > s for the rows between the sink and the tail from maps, and
then runs the tail exactly over that cache.  Given the exact inputs of every layer for a prompt (captured once
through the fork), the tail's forward from the split layer on is cheap to redo in numpy for any set of filled K/V:
this script does that for llama-architecture models (SmolLM2) and reports, per map variant, the two measures that
decide a setting — tail KL(exact‖variant) and pass-key retrieval (teacher-forced: every answer token must be the
greedy choice) — on the same prompts.  Variants are fitted here from a calibration pass like `ridgefill calibrate`'s
(same text, chunks, sink and held-out λ), so features the runtime cannot use yet can be compared with ones it can.
A variant "bandBwW-..." runs layers s..s+B−1 on the filled rows with attention windowed to W positions (and the sink),
then fills the rest from maps fitted at split s+B (docs/maps.md, "A windowed band"); "bandBwWxK-..." also sees every
K-th key before the window, weighted by K; "bandBwWfL1.L2-..." leaves band layers L1, L2 unwindowed;
"bandBwWhN-..." leaves the N kv heads of the band unwindowed whose window changes their output most on calibration
text (select_heads).

The numpy forward is checked against the fork: with exact K/V it reproduces the captured tail inputs of every
layer (relative error printed as `check`), so the KL here measures the fill, not numpy-vs-ggml arithmetic.

    python scripts/fill_sim.py SmolLM2.gguf --split-layer 15 --variants input-c0,input-c1 --prompts 16
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf.quants import dequantize
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill import bench, calibrate, data, evaluate, kvproj, ridge  # noqa: E402
from ridgefill.ggufio import field_value, read_maps  # noqa: E402
from ridgefill.kvproj import rms_norm  # noqa: E402
from ridgefill.modelfile import open_gguf  # noqa: E402
from ridgefill.stats import bootstrap_mean, fmt_ci, wilson  # noqa: E402


# ---- the model in numpy (llama architecture) ----------------------------------------------------------------

@dataclass
class Layer:
    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


class NumpyLlama:
    """The layers of a llama-architecture GGUF in float32 numpy, enough to run rows from layer s to the logits."""

    def __init__(self, path: str):
        r = open_gguf(path)
        arch = field_value(r, "general.architecture")
        if arch != "llama":
            raise SystemExit(f"fill_sim.py runs llama-architecture models, not {arch}")
        self.n_layer = int(field_value(r, "llama.block_count"))
        self.n_head = int(field_value(r, "llama.attention.head_count"))
        self.n_kv = int(field_value(r, "llama.attention.head_count_kv"))
        self.eps = float(field_value(r, "llama.attention.layer_norm_rms_epsilon"))
        self.base = float(field_value(r, "llama.rope.freq_base", 10000.0))
        t = {x.name: x for x in r.tensors}

        def get(name):
            x = t[name]
            return dequantize(x.data, x.tensor_type).astype(np.float32)

        self.layers = [Layer(*(get(f"blk.{l}.{n}.weight") for n in
                               ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                                "ffn_up", "ffn_down"))) for l in range(self.n_layer)]
        self.d = self.layers[0].wq.shape[1]
        self.hd = self.layers[0].wq.shape[0] // self.n_head
        self.out_norm = get("output_norm.weight")
        self.out = get("output.weight") if "output.weight" in t else get("token_embd.weight")

        self.kvw = [kvproj.KVWeights(L.attn_norm, L.wk, L.wv, None, None, None, self.n_kv, self.eps)
                    for L in self.layers]

    def kv(self, l: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pre-RoPE K (n, n_kv, hd) and V (n, n_kv, hd) of layer l for inputs x (n, d)."""
        k, v = kvproj.project(self.kvw[l], x)
        return k, v.reshape(len(x), self.n_kv, self.hd)

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """llama.cpp's NORM rotation (pairs 2i, 2i+1) of x (n, heads, hd) at positions pos (n,)."""
        inv = self.base ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        c, s = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
        return out

    def attend(self, l: int, xn: np.ndarray, pos: np.ndarray, K: np.ndarray, V: np.ndarray,
               hidden: slice | None = None, window: tuple[int, int] | None = None,
               full_heads: frozenset = frozenset()) -> np.ndarray:
        """Layer l's attention output (after its output projection) for rows with normed inputs xn at positions pos
        over a cache K, V (pre-RoPE, rows = positions 0..); causal; `hidden` cache rows are not seen; window =
        (w, sink): a row sees only the sink rows and its own w latest positions; the query heads of the kv heads in
        full_heads see every earlier position all the same."""
        o = self.attend_heads(l, xn, pos, K, V, hidden, window, full_heads)
        return o.reshape(len(xn), -1) @ self.layers[l].wo.T

    def attend_heads(self, l: int, xn: np.ndarray, pos: np.ndarray, K: np.ndarray, V: np.ndarray,
                     hidden: slice | None = None, window: tuple[int, int] | None = None,
                     full_heads: frozenset = frozenset()) -> np.ndarray:
        """attend's output per query head (n, n_head, hd), before the output projection."""
        L = self.layers[l]
        q = self.rope((xn @ L.wq.T).reshape(len(xn), self.n_head, self.hd), pos)
        K = self.rope(K, np.arange(len(K)))
        if window is not None:          # by blocks of rows, each over the sink and the keys its window reaches
            w, sink, stride = (*window, 0)[:3]
            o = np.empty((len(xn), self.n_head, self.hd), dtype=np.float32)
            for a in range(0, len(xn), 512):
                p = pos[a:a + 512]
                keys = np.concatenate([np.arange(min(sink, p[0])), np.arange(max(sink, p[0] - w + 1), p[-1] + 1)])
                seen = (keys[None, :] <= p[:, None]) & ((keys[None, :] < sink) | (keys[None, :] > p[:, None] - w))
                mask = np.where(seen, 0, -np.inf).astype(np.float32)
                if stride:              # and every stride-th key before its window, standing for stride keys
                    far = np.arange(-(-sink // stride) * stride, max(0, p[-1] - w + 1), stride)
                    keys = np.union1d(keys, far)
                    k, q_pos = keys[None, :], p[:, None]
                    in_window = (k <= q_pos) & ((k < sink) | (k > q_pos - w))
                    strided = (k >= sink) & (k <= q_pos - w) & (k % stride == 0)
                    mask = np.where(in_window, 0, np.where(strided, np.log(stride), -np.inf)).astype(np.float32)
                o[a:a + 512] = self.softmax_av(q[a:a + 512], K[keys], V[keys], mask)
            heads = [h for h in range(self.n_head) if h // (self.n_head // self.n_kv) in full_heads]
            for a in range(0, len(xn) if heads else 0, 512):   # unwindowed heads: causal over every key
                p = pos[a:a + 512]
                mask = np.where(np.arange(p[-1] + 1)[None, :] > p[:, None], -np.inf, 0).astype(np.float32)
                o[a:a + 512, heads] = self.softmax_av(q[a:a + 512], K[:p[-1] + 1], V[:p[-1] + 1], mask,
                                                      heads)[:, heads]
            return o
        j = np.arange(len(K))[None, :]
        mask = np.where(j > pos[:, None], -np.inf, 0).astype(np.float32)
        if hidden is not None:
            mask[:, hidden] = -np.inf
        return self.softmax_av(q, K, V, mask)

    def softmax_av(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray,
                   heads: list[int] | None = None) -> np.ndarray:
        """softmax(q·K/√hd + mask)·V per head (GQA: query head h reads kv head h // (n_head / n_kv)); with `heads`
        only those query heads are computed (the others are left zero)."""
        g = self.n_head // self.n_kv
        q = q * np.float32(1 / np.sqrt(self.hd))
        o = np.zeros(q.shape, dtype=np.float32)
        for h in range(self.n_head) if heads is None else heads:   # in place: at 8K a score matrix is 1K x 8K
            sc = q[:, h] @ K[:, h // g].T
            sc += mask
            sc -= sc.max(1, keepdims=True)
            np.exp(sc, out=sc)
            o[:, h] = (sc @ V[:, h // g]) / sc.sum(1, keepdims=True)
        return o

    def attn(self, l: int, x: np.ndarray) -> np.ndarray:
        """Layer l's attention output for every row of one sequence x (n, d), exactly."""
        k, v = self.kv(l, x)
        return self.attend(l, rms_norm(x, self.layers[l].attn_norm, self.eps), np.arange(len(x)), k, v)

    def tail(self, s: int, h_tail: np.ndarray, start: int, prefix: list[tuple[np.ndarray, np.ndarray]],
             hidden: dict[int, slice] | None = None):
        """Run the tail rows (inputs h_tail of layer s, positions start..) through layers s.. over a cache whose
        rows 0..start-1 are prefix[l - s] = (K, V) pre-RoPE; hidden[l]: cache rows the tail does not see in
        layer l.  Returns the tail's logits and its layer inputs."""
        x = h_tail.astype(np.float32)
        pos = np.arange(start, start + len(x))
        inputs = []
        for i, l in enumerate(range(s, self.n_layer)):
            inputs.append(x)
            k_t, v_t = self.kv(l, x)
            K, V = np.concatenate([prefix[i][0], k_t]), np.concatenate([prefix[i][1], v_t])
            x = self.block(l, x, pos, K, V, (hidden or {}).get(l))
        return rms_norm(x, self.out_norm, self.eps) @ self.out.T, inputs

    def block(self, l: int, x: np.ndarray, pos: np.ndarray, K: np.ndarray, V: np.ndarray,
              hidden: slice | None = None, window: tuple[int, int] | None = None,
              full_heads: frozenset = frozenset()) -> np.ndarray:
        """Layer l on rows x at positions pos over the cache K, V (which holds the rows' own K/V): its output."""
        L = self.layers[l]
        x = x + self.attend(l, rms_norm(x, L.attn_norm, self.eps), pos, K, V, hidden, window, full_heads)
        xn = rms_norm(x, L.ffn_norm, self.eps)
        a = xn @ L.gate.T
        return x + ((a / (1 + np.exp(-a))) * (xn @ L.up.T)) @ L.down.T


# ---- map variants ----------------------------------------------------------------------------------------

@dataclass
class Variant:
    """A map variant: kind "input" (x̂_l = W f + b, then the layer's projections) or "kv" (K̂, V̂ = W f + b)."""
    name: str
    kind: str
    C: int
    W: list | None = None           # per late layer (input), or per target K(s+1), V(s+1), ... (kv)
    b: list | None = None
    base: "Variant | None" = None   # a modified variant ("BASE@k17+v18+m19") fills as its base, then:
    exact_k: frozenset = frozenset()    # layers whose filled rows get their exact K
    exact_v: frozenset = frozenset()    # ... their exact V
    hidden: frozenset = frozenset()     # layers whose filled rows the tail does not see (masked out)
    mix: int = 0                    # > 0: a mixture of maps, one per cluster of the split state ("mix8-input-c1")
    gate: tuple | None = None       # (mean, scale, projection, centroids) that route a row to its cluster
    Wc: list | None = None          # per cluster: [W per target], [b per target]
    bc: list | None = None
    budget: int | None = None       # calibration tokens it is fitted on (None: all that were read)
    clamp: bool = False             # kv: each predicted K and V head's norm clamped to its largest in calibration
    norm_max: list | None = None    # per target: (n_kv,) largest head norm on the calibration rows
    band: int = 0                   # > 0: layers s..s+band−1 run on the filled rows with windowed attention, and
    window: int = 0                 # the maps (fitted at split s+band) read their output ("band5w256-input-c1");
                                    # window 0 ("band5-input-c1"): the band is exact, a later split
    stride: int = 0                 # > 0: band rows also see every stride-th key before their window, each weighted
                                    # by stride in the softmax (mask +ln stride), "band10w512x8-..."
    full: frozenset = frozenset()   # band layers that attend to every earlier position: "band10w1024f16.17-..."
    heads: int = 0                  # > 0: that many kv heads of the band are left unwindowed, those whose window
    full_heads: dict = field(default_factory=dict)  # changes their output most on calibration text (select_heads):
                                    # layer -> frozenset of kv heads, "band10w1024h6-..."

    def features(self, h: np.ndarray, start: int) -> np.ndarray:
        return ridge.context_features(h, self.C, start)

    def cluster(self, h: np.ndarray) -> np.ndarray:
        mu, sd, P, cent = self.gate
        z = ((h - mu) / sd) @ P
        return (z @ cent.T - 0.5 * (cent * cent).sum(1)).argmax(1)

    def predict(self, i: int, f: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Target i's prediction for features f of rows whose split states are h."""
        if not self.mix:
            return f @ self.W[i].T + self.b[i]
        c = self.cluster(h)
        out = np.empty((len(f), self.Wc[0][i].shape[0]), dtype=np.float32)
        for k in range(self.mix):
            sel = c == k
            if sel.any():
                out[sel] = f[sel] @ self.Wc[k][i].T + self.bc[k][i]
        return out

    def fill(self, model: NumpyLlama, s: int, acts: np.ndarray, lo: int, hi: int):
        """Predicted pre-RoPE (K, V) of every late layer for rows lo..hi-1 of a prompt with exact layer inputs acts
        (n_layer, n, d); rows < lo (the sink) are exact."""
        out = []
        h = acts[s]
        if self.band and not self.window:   # an exact band is a later split: the exact layer inputs
            out += [model.kv(l, acts[l, lo:hi]) for l in range(s + 1, s + self.band + 1)]
            s, h = s + self.band, acts[s + self.band]
        elif self.band:                 # the band's layers run on the filled rows, attention windowed
            x = acts[s, :hi].copy()
            pos = np.arange(lo, hi)
            for l in range(s, s + self.band):
                if l > s:
                    out.append(model.kv(l, x[lo:]))
                K, V = model.kv(l, x)
                window = None if l in self.full else (self.window, lo, self.stride)
                x[lo:] = model.block(l, x[lo:], pos, K, V, window=window,
                                     full_heads=self.full_heads.get(l, frozenset()))
                x[:lo] = acts[l + 1, :lo]
            out.append(model.kv(s + self.band, x[lo:]))
            s, h = s + self.band, x
        f = self.features(h[:hi], lo).astype(np.float32)
        hr = h[lo:hi]
        for i, l in enumerate(range(s + 1, model.n_layer)):
            if self.kind == "input":
                out.append(model.kv(l, self.predict(i, f, hr)))
            else:
                shape = (len(f), model.n_kv, model.hd)
                kv = [self.predict(2 * i + p, f, hr).reshape(shape) for p in (0, 1)]
                if self.clamp:
                    for p in (0, 1):
                        norms = np.linalg.norm(kv[p], axis=-1, keepdims=True)
                        kv[p] = kv[p] * np.minimum(1.0, self.norm_max[2 * i + p][None, :, None] /
                                                   np.maximum(norms, 1e-30))
                out.append(tuple(kv))
        return out


def flop_limit(shape: bench.Shape, v: Variant, s: int, n: int, tail: int, sink: int) -> float:
    """Analytic prefill speedup of variant v at split s (bench.flops): a band is the exact layers of split s+band,
    less the attention its filled rows do not do (they see the sink and their window, not every earlier key)."""
    v = v.base or v
    total = bench.flops(shape, n, s + v.band, tail, sink, v.kind, v.C, v.band if v.window else 0, v.window)
    m = max(0, n - tail - sink - v.window) if v.window else 0
    if v.stride:                        # of the keys a window skips, every stride-th is seen after all
        total += v.band * 2 * 2 * shape.n_head * shape.head_dim * m * (m + 1) / 2 / v.stride
    total += len(v.full) * 2 * 2 * shape.n_head * shape.head_dim * m * (m + 1) / 2    # unwindowed band layers
    total += v.heads * shape.n_head // shape.n_kv * 2 * 2 * shape.head_dim * m * (m + 1) / 2   # ... and heads
    return bench.flops(shape, n) / total


def parse_variants(specs: list[str]) -> list[Variant]:
    """"input-c1", "kv-c0", "PATH.gguf", or a modified one "BASE@k17+v18+kv19+m20": BASE with exact K (k), exact
    V (v), both (kv) in some late layers, or their filled rows hidden from the tail (m); BASE is fitted once."""
    out, bases = [], {}
    for spec in specs:
        base_spec, _, mods = spec.partition("@")
        if base_spec not in bases:
            bases[base_spec] = parse_variant(base_spec)
        if not mods:
            out.append(bases[base_spec])
            continue
        sets = {"k": set(), "v": set(), "m": set()}
        for m in mods.split("+"):
            what, layers = m.rstrip("0123456789-"), m.lstrip("kvm")
            lo, _, hi = layers.partition("-")
            ls = range(int(lo), int(hi or lo) + 1)
            for w in ("k", "v") if what == "kv" else (what,):
                sets[w].update(ls)
        b = bases[base_spec]
        out.append(Variant(spec, b.kind, b.C, base=b, exact_k=frozenset(sets["k"]), exact_v=frozenset(sets["v"]),
                           hidden=frozenset(sets["m"])))
    return out, list(bases.values())


def parse_variant(spec: str) -> Variant:
    if spec.startswith("band"):                     # "band5w256-input-c1"
        b, rest = spec[4:].split("-", 1)
        band, _, w = b.partition("w")
        w, _, full = w.partition("f")
        w, _, heads = w.partition("h")
        w, _, stride = w.partition("x")
        v = parse_variant(rest)
        if v.mix:
            raise SystemExit(f"{spec!r}: a band with mixture maps is not supported")
        v.name, v.band, v.window, v.stride = spec, int(band), int(w or 0), int(stride or 0)
        v.full = frozenset(int(x) for x in full.split(".") if x)
        v.heads = int(heads or 0)
        return v
    if spec.endswith(".gguf"):                      # a map file from `ridgefill calibrate`, as the runtime has it
        m = read_maps(spec)
        late = m.late_layers
        if m.map_kind == "input":
            W, b = [m.weights[l] for l in late], [m.biases[l] for l in late]
        else:
            dk = m.kv_dims[0]
            W = [w for l in late for w in (m.weights[l][:dk], m.weights[l][dk:])]
            b = [x for l in late for x in (m.biases[l][:dk], m.biases[l][dk:])]
        return Variant(Path(spec).stem, m.map_kind, m.context_tokens, W, b)
    budget = None
    if spec.endswith("~clamp"):                     # "kv-c1~clamp": K/V head norms clamped to the calibrated range
        v = parse_variant(spec[:-len("~clamp")])
        v.name, v.clamp = spec, True
        return v
    if "#" in spec:                                 # "input-c0#65536": fitted on the first 65536 calibration tokens
        spec_base, n = spec.split("#")
        v = parse_variant(spec_base)
        v.name, v.budget = spec, int(n)
        return v
    mix = 0
    rest = spec
    if spec.startswith("mix"):
        m, rest = spec[3:].split("-", 1)
        mix = int(m)
    kind, c = rest.rsplit("-c", 1)
    if kind not in ("input", "kv"):
        raise SystemExit(f"unknown variant {spec!r}: input-cN, kv-cN, mixM-input-cN")
    return Variant(spec, kind, int(c), mix=mix, budget=budget)


def kv_targets(model: NumpyLlama, s: int, xs: np.ndarray) -> np.ndarray:
    """(2L, n, n_kv·hd): K(s+1), V(s+1), ... of late-layer inputs xs (L, n, d), as calibrate's targets."""
    return calibrate.kv_targets(model.kvw[s + 1:], xs, model.n_kv * model.hd)


def fit(variants: list[Variant], model: NumpyLlama, s: int, chunks: list[np.ndarray], is_val: np.ndarray,
        sink: int) -> None:
    """Closed-form ridge per variant, λ per target chosen on the held-out chunks (as `ridgefill calibrate`)."""
    all_chunks, all_val = chunks, is_val
    done = {}
    for v in variants:
        if v.W is not None:
            continue
        key = (v.kind, v.C, v.band, v.budget, v.mix)    # bands of one depth share their maps, whatever the window
        if key in done and not v.mix:
            v.W, v.b, v.norm_max = done[key].W, done[key].b, done[key].norm_max
            continue
        done[key] = v
        if v.budget:                    # the first chunks of the reading, held out as calibrate would
            chunks = all_chunks[:-(-v.budget // all_chunks[0].shape[1])]
            is_val = calibrate.val_chunks(len(chunks), 0.1)
        else:
            chunks, is_val = all_chunks, all_val
        t0 = time.time()
        sv = s + v.band
        L = model.n_layer - sv - 1
        D = (v.C + 1) * model.d
        dt = model.d if v.kind == "input" else model.n_kv * model.hd
        nt = L if v.kind == "input" else 2 * L
        train, val = ridge.Moments(D, nt, dt), ridge.Moments(D, nt, dt)
        norm_max = np.zeros((nt, model.n_kv))
        for acts, held in zip(chunks, is_val):
            acts = acts[v.band:]
            f = v.features(acts[0], sink)
            xs = acts[1:, sink:]
            ys = xs if v.kind == "input" else kv_targets(model, sv, xs)
            (val if held else train).add(f, ys)
            if v.kind == "kv" and not held:
                heads = np.linalg.norm(ys[:, :, :model.n_kv * model.hd].reshape(nt, len(f), model.n_kv, -1), axis=-1)
                norm_max = np.maximum(norm_max, heads.max(1))
        v.norm_max = list(norm_max.astype(np.float32))
        prior = "identity" if v.kind == "input" else "zero"
        lams, _ = ridge.pick_lambda(train, val, prior)
        W, b = ridge.solve(train, lams, prior, dtype=np.float32)
        v.W, v.b = list(W), [x.astype(np.float32) for x in b]
        print(f"fit {v.name}: {time.time() - t0:.0f}s, λ {np.unique(lams).tolist()}", file=sys.stderr)
        if v.mix:
            fit_mixture(v, model, s, chunks, is_val, sink, train.n)


def kmeans(z: np.ndarray, k: int, iters: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cent = z[rng.choice(len(z), k, replace=False)]
    for _ in range(iters):
        a = (z @ cent.T - 0.5 * (cent * cent).sum(1)).argmax(1)
        for j in range(k):
            if (a == j).any():
                cent[j] = z[a == j].mean(0)
    return cent


def fit_mixture(v: Variant, model: NumpyLlama, s: int, chunks, is_val, sink: int, n_train: int,
                grid=(1e-2, 1e-1, 1.0, 10.0)) -> None:
    """One map per cluster of the split state (k-means on its 64 leading standardised principal components),
    each ridge-shrunk toward the global map with a λ per cluster and target chosen on the held-out chunks."""
    t0 = time.time()
    H = np.concatenate([a[0, sink:] for a, held in zip(chunks, is_val) if not held])
    mu, sd = H.mean(0), H.std(0) + 1e-6
    Z = (H - mu) / sd
    _, _, Vt = np.linalg.svd(Z[:: max(1, len(Z) // 8192)], full_matrices=False)
    P = Vt[:64].T.astype(np.float32)
    cent = kmeans((Z @ P).astype(np.float32), v.mix)
    v.gate = (mu.astype(np.float32), sd.astype(np.float32), P, cent)
    nt, D = len(v.W), v.W[0].shape[1]
    dt = v.W[0].shape[0]
    mom = [(ridge.Moments(D, nt, dt), ridge.Moments(D, nt, dt)) for _ in range(v.mix)]
    for acts, held in zip(chunks, is_val):
        f = v.features(acts[0], sink)
        xs = acts[1:, sink:]
        ys = xs if v.kind == "input" else kv_targets(model, s, xs)
        c = v.cluster(acts[0, sink:])
        for k in range(v.mix):
            sel = c == k
            if sel.any():
                mom[k][1 if held else 0].add(f[sel], ys[:, sel])
    v.Wc, v.bc = [], []
    Wg = np.stack(v.W).astype(np.float64)
    sizes = []
    for k, (tr, va) in enumerate(mom):
        sizes.append(tr.n)
        best = [None] * nt
        for lam in grid:
            for i, W, b in solve_toward(tr, lam, Wg, np.stack(v.b)):
                e = ridge.sse_layer(va, i, W, b) if va.n else 0.0
                if best[i] is None or e < best[i][0]:
                    best[i] = (e, W.astype(np.float32), b.astype(np.float32))
            if not va.n:
                break
        v.Wc.append([x[1] for x in best])
        v.bc.append([x[2] for x in best])
    print(f"fit {v.name} mixture: {time.time() - t0:.0f}s, cluster sizes {sizes}", file=sys.stderr)


def solve_toward(m: ridge.Moments, lam_rel: float, Wp: np.ndarray, bp: np.ndarray):
    """Ridge toward a prior map: min Σ|y − W f − b|² + λ|W − Wp|² per target; yields (i, W, b)."""
    import scipy.linalg
    if m.n < 2:
        for i in range(m.L):
            yield i, Wp[i], bp[i]
        return
    mu_f, mu_y = m.sh / m.n, m.sx / m.n
    A = m.shh - m.n * np.outer(mu_f, mu_f)
    lam = lam_rel * max(np.trace(A) / m.d, 1e-12)
    A[np.diag_indices(m.d)] += lam
    chol = scipy.linalg.cho_factor(A)
    for i in range(m.L):
        rhs = m.shx[i] - m.n * np.outer(mu_f, mu_y[i]) + lam * Wp[i].T
        W = scipy.linalg.cho_solve(chol, rhs).T
        yield i, W, mu_y[i] - W @ mu_f


# ---- prompts ------------------------------------------------------------------------------------------------

def capture(runner: calibrate.LayerInputs, toks: list[int]) -> np.ndarray:
    return runner.run(np.asarray(toks, dtype=np.int32))


def kl_prompts(runner, text: str, length: int, count: int, skip: int = 0) -> list[list[int]]:
    need = skip + count * (length - len(runner.bos))
    toks = runner.tokenize(text[: need * 8])[skip:]
    n = length - len(runner.bos)
    step = max(1, (len(toks) - n) // max(1, count - 1))
    return [runner.bos + toks[i * step:i * step + n] for i in range(count)]


def needle_prompts(runner, text: str, length: int, tail: int, sink: int, depths: list[float], per_depth: int,
                   seed: int) -> list[tuple[list[int], int, int]]:
    """(tokens, needle position, answer length): evaluate's needle prompt of `length` tokens followed by the
    answer's tokens (teacher forcing: the tail grows by the answer, the filled region is eval's)."""
    rng = random.Random(seed)
    hay_all = runner.tokenize(text[: (length + 2000 * per_depth) * 8])
    out = []
    for depth in depths:
        for _ in range(per_depth):
            key = str(rng.randrange(10000, 100000))
            off = rng.randrange(0, max(1, len(hay_all) - length))
            nd, q = runner.tokenize(evaluate.NEEDLE.format(key=key)), runner.tokenize(evaluate.QUESTION)
            ans = runner.tokenize(" " + key)
            n_hay = length - len(runner.bos) - len(nd) - len(q)
            lo, hi = sink, length - tail - len(nd)
            pos = lo + round(depth * (hi - lo))
            at = pos - len(runner.bos)
            hay = hay_all[off:]
            out.append((runner.bos + hay[:at] + nd + hay[at:n_hay] + q + ans, pos, len(ans)))
    return out


def run_prompt(model: NumpyLlama, s: int, acts: np.ndarray, tail: int, sink: int, variants: list[Variant]):
    """Tail logits exact and per variant for one prompt; acts (n_layer, n, d) are its exact layer inputs."""
    n = acts.shape[1]
    start = n - tail
    exact_prefix = [model.kv(l, acts[l, :start]) for l in range(s, model.n_layer)]
    logits_ex, inputs = model.tail(s, acts[s, start:], start, exact_prefix)
    check = max(float(np.linalg.norm(x - acts[s + i, start:]) / np.linalg.norm(acts[s + i, start:]))
                for i, x in enumerate(inputs))
    out, fills = {}, {}
    for v in variants:
        b = v.base or v
        if b.name not in fills:
            fills[b.name] = b.fill(model, s, acts, sink, start)
        prefix = [exact_prefix[0]]
        for i, ((ek, ev), (fk, fv)) in enumerate(zip(exact_prefix[1:], fills[b.name])):
            l = s + 1 + i
            prefix.append((np.concatenate([ek[:sink], ek[sink:] if l in v.exact_k else fk]),
                           np.concatenate([ev[:sink], ev[sink:] if l in v.exact_v else fv])))
        hidden = {l: slice(sink, start) for l in v.hidden}
        out[v.name] = model.tail(s, acts[s, start:], start, prefix, hidden)[0]
    return logits_ex, out, check


def head_scores(model: NumpyLlama, s: int, band: int, window: int, sink: int, acts: np.ndarray) -> np.ndarray:
    """What windowing costs each kv head of band layers s..s+band−1 on one text with exact layer inputs acts:
    (band, n_kv) sums over the rows the window changes (positions ≥ sink + window) of the squared change the window
    makes to the head group's contribution to the residual stream (its query heads' outputs through W_o)."""
    n, g = acts.shape[1], model.n_head // model.n_kv
    lo = min(n, sink + window)
    out = np.zeros((band, model.n_kv))
    for i, l in enumerate(range(s, s + band)):
        L = model.layers[l]
        K, V = model.kv(l, acts[l])
        xn, pos = rms_norm(acts[l, lo:], L.attn_norm, model.eps), np.arange(lo, n)
        d = (model.attend_heads(l, xn, pos, K, V) - model.attend_heads(l, xn, pos, K, V, window=(window, sink)))
        wo = L.wo.reshape(model.d, model.n_head, model.hd)
        for h in range(model.n_head):
            out[i, h // g] += float(np.square(d[:, h] @ wo[:, h].T).sum())
    return out


def select_heads(v: Variant, scores: np.ndarray, s: int) -> dict[int, frozenset]:
    """The v.heads kv heads with the largest scores (head_scores, summed over texts): layer -> kv heads."""
    top = np.argsort(-scores, axis=None, kind="stable")[:v.heads]
    picked: dict[int, set] = {}
    for i in top:
        picked.setdefault(s + int(i) // scores.shape[1], set()).add(int(i) % scores.shape[1])
    return {l: frozenset(h) for l, h in sorted(picked.items())}


def calibration_text(runner, calib_tokens: int, ctx: int) -> str:
    """The Brown documents calibration read (held_out leaves them out)."""
    docs = [d.text for d in data.corpus("brown")]
    need = -(-calib_tokens // ctx) * ctx
    return "\n\n".join(docs[i] for i in calibrate.read_documents(docs, runner.tokenize, need)[1])


def held_out(runner, name: str, calib_tokens: int, ctx: int) -> str:
    """The domain's text; for the calibration corpus (Brown) without the documents calibration read."""
    if name != "brown":
        return data.text(name)
    docs = [d.text for d in data.corpus(name)]
    need = -(-calib_tokens // ctx) * ctx
    seen = set(calibrate.read_documents(docs, runner.tokenize, need)[1])
    return "\n\n".join(t for i, t in enumerate(docs) if i not in seen)


def log_softmax(x):
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--split-layer", "-s", type=int, default=15)
    ap.add_argument("--variants", default="input-c0,input-c1")
    ap.add_argument("--calib-tokens", type=int, default=32768,
                    help="calibration tokens read (variants NAME#N fit on the first N of them)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--sink-tokens", type=int, default=4)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--tail-tokens", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=16, help="KL prompts per domain")
    ap.add_argument("--skip-tokens", type=int, default=0,
                    help="KL prompts start this many tokens into the domain's text (a disjoint second sample)")
    ap.add_argument("--domains", default="shakespeare")
    ap.add_argument("--needle-per-depth", type=int, default=4)
    ap.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--head-prompts", type=int, default=1,
                    help="calibration texts (of --length tokens) that choose a band's unwindowed heads (bandBwWhN)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    s, sink, T = args.split_layer, args.sink_tokens, args.tail_tokens
    model = NumpyLlama(args.model)
    variants, bases = parse_variants(args.variants.split(","))
    threads = os.cpu_count()

    if any(b.W is None for b in bases):
        runner = calibrate.LayerInputs(Path(args.model), list(range(s, model.n_layer)), args.ctx, threads)
        cfg = calibrate.CalibConfig(model=Path(args.model), split_layer=s, tokens=args.calib_tokens, ctx=args.ctx)
        chunks = [runner.run(c) for c in calibrate.token_budget(runner, cfg)]
        is_val = calibrate.val_chunks(len(chunks), 0.1)
        fit(bases, model, s, chunks, is_val, sink)
        del chunks, runner

    runner = calibrate.LayerInputs(Path(args.model), list(range(model.n_layer)), args.length + 16, threads)
    result = {"split_layer": s, "length": args.length, "tail_tokens": T, "skip_tokens": args.skip_tokens,
              "variants": [v.name for v in variants],
              "kl": {}, "needle": {}}
    checks = []
    banded = {(v.band, v.window) for v in variants if v.heads}
    if banded:                  # unwindowed heads are chosen on calibration text, never on the prompts
        picks = kl_prompts(runner, calibration_text(runner, args.calib_tokens, args.ctx), args.length,
                           args.head_prompts)
        scores = {bw: 0 for bw in banded}
        for toks in tqdm(picks, desc="head scores", unit="text"):
            acts = capture(runner, toks)
            for band, w in banded:
                scores[band, w] = scores[band, w] + head_scores(model, s, band, w, sink, acts)
        result["head_scores"] = {f"band{b}w{w}": x.tolist() for (b, w), x in scores.items()}
        result["full_heads"] = {}
        for v in variants:
            if v.heads:
                v.full_heads = select_heads(v, scores[v.band, v.window], s)
                result["full_heads"][v.name] = {l: sorted(h) for l, h in v.full_heads.items()}
                print(f"{v.name}: unwindowed kv heads {result['full_heads'][v.name]}", file=sys.stderr)
    for dom in args.domains.split(","):
        text = held_out(runner, dom, args.calib_tokens, args.ctx)
        per = {v.name: [] for v in variants}
        prompts = kl_prompts(runner, text, args.length, args.prompts, args.skip_tokens)
        for toks in tqdm(prompts, desc=f"KL {dom}", unit="prompt"):
            acts = capture(runner, toks)
            ex, got, check = run_prompt(model, s, acts, T, sink, variants)
            checks.append(check)
            lp = log_softmax(ex)
            for name, lg in got.items():
                per[name].append(float((np.exp(lp) * (lp - log_softmax(lg))).sum(-1).mean()))
        result["kl"][dom] = per
        print(f"{dom}: " + ", ".join(f"{k} KL {np.mean(x):.4f}" for k, x in per.items()), file=sys.stderr)

    depths = [float(x) for x in args.depths.split(",")]
    hits = {m: [] for m in ["exact", *[v.name for v in variants]]}
    logp = {m: [] for m in hits}                   # log-probability of the whole answer, teacher-forced
    for toks, pos, n_ans in tqdm(needle_prompts(runner, data.text("shakespeare"), args.length, T, sink, depths,
                                                args.needle_per_depth, args.seed), desc="needle", unit="key"):
        acts = capture(runner, toks)
        ex, got, check = run_prompt(model, s, acts, T + n_ans, sink, variants)
        checks.append(check)
        want = np.asarray(toks[-n_ans:])
        for name, lg in [("exact", ex), *got.items()]:
            hits[name].append(float((lg[-n_ans - 1:-1].argmax(-1) == want).all()))
            logp[name].append(float(log_softmax(lg[-n_ans - 1:-1])[np.arange(n_ans), want].sum()))
    result["needle"] = hits
    result["needle_logp"] = logp
    result["check_max_rel_err"] = float(max(checks))
    print(f"check: numpy tail vs the fork's layer inputs, max relative error {max(checks):.2e}", file=sys.stderr)

    print(f"\nsplit {s}, {args.length}-token prompts, {T}-token tail, maps fitted on {args.calib_tokens} Brown tokens\n")
    shape = bench.Shape.of(args.model)
    limits = {v.name: flop_limit(shape, v, s, args.length, T, sink) for v in variants}
    result["flop_limit"] = limits
    print("| variant | FLOP limit | " + " | ".join(f"KL {d}" for d in result["kl"])
          + " | needle | Δ answer log-prob |")
    print("|---|---|" + "---|" * len(result["kl"]) + "---|---|")
    ex = np.asarray(hits["exact"])
    lp_ex = np.asarray(logp["exact"])
    print("| exact | 1× | " + " | ".join("0" for _ in result["kl"]) + f" | {int(ex.sum())}/{len(ex)} | "
          f"(exact {lp_ex.mean() if len(lp_ex) else float('nan'):.2f}) |")
    for v in variants:
        kls = []
        for d, per in result["kl"].items():
            x = np.asarray(per[v.name])
            kls.append(fmt_ci(bootstrap_mean(x, np.arange(len(x)), seed=0), 4))
        h = np.asarray(hits[v.name])
        dl = np.asarray(logp[v.name]) - lp_ex
        print(f"| {v.name} | {limits[v.name]:.2f}× | " + " | ".join(kls) + f" | {int(h.sum())}/{len(h)} | "
              f"{fmt_ci(bootstrap_mean(dl, np.arange(len(dl)), seed=0), 2) if len(dl) else '—'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
