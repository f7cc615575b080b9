"""`ridgefill calibrate`: fit the ridge maps of one split layer in one forward pass over text.

The model runs chunk by chunk through the fork, each chunk decoded from position 0
(BOS first); for every token the inputs of the split layer (h) and of each late layer
(x_l) are captured, and only float64 moments of the features and targets are kept
(ridgefill.ridge.Moments), so memory does not grow with the number of tokens.  The
features of token t are [h_t, h_{t-1}, ..., h_{t-C}] (C = context_tokens); the targets
are x_l (map kind "input") or, for "kv", the layer's K (after any k-norm, before RoPE)
and V from its own projections of x_l, two targets per layer with a λ each.  Whole
chunks are held out for validation (λ choice and diagnostics); the first `sink_tokens`
positions of every chunk are left out of the fit (so C ≤ sink_tokens: the predecessors
of every fitted token are in its chunk).  With a windowed band (band_layers > 0) and chunks
longer than its window, h is what the band passes the maps (LayerInputs), the x_l stay exact.

Memory (docs/scale.md), with D = (C+1)·d the feature width (d the model width, L late layers):
during the pass, the model's weights plus two sets of moments of 8 bytes each per entry of
  input:  D² + L·D·d                  (C = 0: (L+1)·d²)
  kv:     D² + 2L·D·e,  e = d_k = d_v  (K and V widths, n_head_kv·head_dim; the narrower is zero-padded)
plus, for kv, the late layers' K/V weights in float32; then the model is freed, and the λ search and the
solve hold one target's temporaries (D×D factor, D×e right-hand side) at a time plus the maps in float32.
"""
from __future__ import annotations

import os
import resource
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from tqdm import tqdm

from . import data, guard, kvproj, ridge
from ._lib import lib
from ._version import __version__
from .errors import RidgefillError
from .ggufio import (MAP_KINDS, MAP_TYPES, MAX_CONTEXT_TOKENS, MapFile, _AtomicOutput, check_band, field_value,
                     fingerprint, write_maps)
from .modelfile import check_gguf, open_gguf


@dataclass
class CalibConfig:
    model: Path
    split_layer: int
    texts: list[Path] = field(default_factory=list)   # user text files
    corpus: str | None = None                         # or a registry corpus (ridgefill.data)
    tokens: int = 65536                               # tokens fed to the model
    ctx: int = 1024                                   # chunk length, BOS included
    lam: str | float = "auto"                         # relative λ, or "auto" (held-out grid search)
    prior: str | None = None                          # "identity" | "zero"; None: identity for input, zero for kv
    map_kind: str = "input"                           # "input": predict x_l; "kv": K and V of every late layer
    context_tokens: int = 0                           # C: features are h of the token and of its C predecessors
    read_order: str = "sequential"                    # documents from the first on, or "spread" over the collection
    val_fraction: float = 0.1
    map_type: str = "f32"
    sink_tokens: int = 4
    band_layers: int = 0                              # the runtime's default windowed band below the split (0: none)
    band_window: int = 0                              # positions a band layer of a filled row attends to
    band_full_layers: tuple[int, ...] = ()            # band layers that attend to every position (unwindowed)
    threads: int | None = None
    diag_tokens: int = 1024                           # held-out tokens sampled (in 32-row windows): K/V diagnostics, guard
    seed: int = 0
    progress: bool = True


class LayerInputs:
    """The model in the fork, capturing the inputs of layers `layers` for every token of a chunk.

    With a band (band_layers > 0), the split layer's input (layers[0]) is what the windowed band passes the maps, as
    the runtime fills a prompt: every row after the sink runs the band_layers layers below the split attending to the
    sink and its band_window latest positions.  The later layers' inputs stay exact (the maps' targets).  Two passes
    per chunk: exact, then the runtime's approximate path, which needs maps at the split: a placeholder file of zero
    maps (they fill only layers whose output nobody reads), written to a temporary file for the load."""

    def __init__(self, model: Path, layers: list[int], ctx: int, threads: int | None, band_layers: int = 0,
                 band_window: int = 0, sink_tokens: int = 0, band_full_layers: tuple[int, ...] = ()):
        from llama_cpp import Llama
        from llama_cpp import llama_cpp as C
        self.C = C
        # read, not mapped: on x86 llama.cpp repacks q4_0/q4_K weights into buffers of its own, and a mapping
        # would keep the file's copy resident too (8B shape, q4_0: peak RSS 14.2 GB mapped, see docs/scale.md)
        kw = dict(n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, use_mmap=False, n_threads=threads or os.cpu_count(),
                  n_threads_batch=threads or os.cpu_count(), verbose=False)
        self.band = band_layers > 0
        if self.band:
            from llama_cpp._utils import suppress_stdout_stderr

            from .runtime import Llama as RidgefillLlama
            with tempfile.TemporaryDirectory(prefix="ridgefill-") as tmp, suppress_stdout_stderr(disable=False):
                zero = Path(tmp) / "band-placeholder.gguf"
                _zero_maps(model, layers[0], sink_tokens, band_layers, band_window, zero, band_full_layers)
                # flash attention: the band's window is skipped, not only masked (docs/runtime.md); quiet: the
                # runtime's notes on loading the placeholder (no guard in it) are not the user's business
                self.llm = RidgefillLlama(str(model), maps_path=str(zero), tail_tokens=1, sink_tokens=sink_tokens,
                                          guard=False, flash_attn=True, **kw)
        else:
            self.llm = Llama(model_path=str(model), **kw)
        self.d = self.llm.n_embd()
        self.layers = layers
        h = lib()
        self._get = h.llama_ridgefill_layer_input
        for l in layers:
            if not h.llama_ridgefill_capture_layer_input(self.llm.ctx, l, True):
                raise RidgefillError(f"cannot capture the input of layer {l} "
                                     "(layer out of range, or an architecture that does not expose layer inputs)")

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8", errors="replace"), add_bos=False, special=False)

    @property
    def bos(self) -> list[int]:
        vocab = self.C.llama_model_get_vocab(self.llm.model)
        return [self.llm.token_bos()] if self.C.llama_vocab_get_add_bos(vocab) else []

    def run(self, tokens: np.ndarray) -> np.ndarray:
        """Decode one chunk from position 0; returns (len(layers), n, d) float32 layer inputs."""
        C, n = self.C, len(tokens)
        if self.band:
            self.llm.set_ridgefill(False)
            self.llm.reset()
        C.llama_memory_clear(C.llama_get_memory(self.llm.ctx), True)
        arr = (C.llama_token * n)(*map(int, tokens))
        rc = C.llama_decode(self.llm.ctx, C.llama_batch_get_one(arr, n))
        if rc != 0:
            raise RidgefillError(f"llama_decode failed with {rc}")
        out = np.empty((len(self.layers), n, self.d), dtype=np.float32)
        for i, l in enumerate(self.layers):
            out[i] = np.ctypeslib.as_array(self._get(self.llm.ctx, l), shape=(n, self.d))
        if self.band:                                              # the split layer's input through the band
            self.llm.set_ridgefill(True)
            self.llm.reset()
            self.llm.eval(tokens)                                  # one decode (n_batch = ctx): the last tail row exact
            filled, exact = self.llm.ridgefill_counts()
            if filled + exact != n or filled < n - 1 - self.llm.sink_tokens:
                raise RidgefillError(f"the band pass filled {filled} of {n} rows")
            out[0] = np.ctypeslib.as_array(self._get(self.llm.ctx, self.layers[0]), shape=(n, self.d))
        return out


def _zero_maps(model: Path, split: int, sink_tokens: int, band_layers: int, band_window: int, path: Path,
               band_full_layers: tuple[int, ...] = ()) -> None:
    """A map file of zero input maps at `split` recording a band: what puts the runtime on its approximate path."""
    reader = open_gguf(model)
    arch = field_value(reader, "general.architecture")
    n_layer, d = int(field_value(reader, f"{arch}.block_count")), int(field_value(reader, f"{arch}.embedding_length"))
    late = range(split + 1, n_layer)
    write_maps(path, MapFile(arch=arch, n_layer=n_layer, split_layer=split, prior="zero",
                             ridge_lambda=np.zeros(len(late)), calib_tokens=0, sink_tokens=sink_tokens,
                             base_fingerprint=fingerprint(reader), map_type="f16",
                             weights={l: np.zeros((d, d), np.float32) for l in late},
                             biases={l: np.zeros(d, np.float32) for l in late},
                             band_layers=band_layers, band_window=band_window,
                             band_full_layers=tuple(band_full_layers)))


READ_ORDERS = ("sequential", "spread")


def reading_order(n: int, order: str) -> list[int]:
    """The order in which calibration reads n documents.  "sequential": 0, 1, 2, ...  "spread": the base-2
    van der Corput sequence 0, 1/2, 1/4, 3/4, 1/8, ... scaled to n (each index once), so that the first k
    documents read are spread over the whole collection, whatever k the token budget turns out to need: a corpus
    stored genre by genre (Brown) gives every genre its share instead of the first genre all of it."""
    if order not in READ_ORDERS:
        raise RidgefillError(f"unknown reading order {order!r}; known: {', '.join(READ_ORDERS)}")
    if order == "sequential":
        return list(range(n))
    bits = max(1, (n - 1).bit_length())          # 2**bits >= n: the scaled sequence visits every index
    out, seen = [], set()
    for j in range(1 << bits):
        i = int(format(j, f"0{bits}b")[::-1], 2) * n >> bits
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def read_documents(texts: list[str], tokenize, need: int, order: str = "sequential") -> tuple[list[int], list[int]]:
    """Calibration's reading: documents in `order` (reading_order), each followed by a blank line, until `need`
    tokens.  Returns the token ids and the indices of the documents read (`ridgefill eval` skips those)."""
    ids: list[int] = []
    read: list[int] = []
    for i in reading_order(len(texts), order):
        ids += tokenize(texts[i] + "\n\n")
        read.append(i)
        if len(ids) >= need:
            break
    return ids, read


def token_budget(runner: LayerInputs, cfg: CalibConfig) -> list[np.ndarray]:
    """Chunks of token ids (BOS + text) totalling cfg.tokens, from the user's files or a corpus."""
    if cfg.texts:
        docs = []
        for p in cfg.texts:
            p = Path(p)
            if not p.is_file():
                raise RidgefillError(f"text file {p} does not exist")
            docs.append(p.read_text(encoding="utf-8", errors="replace"))
        source = ", ".join(str(p) for p in cfg.texts)
    else:
        docs = [d.text for d in data.corpus(cfg.corpus or "brown")]
        source = f"corpus {cfg.corpus or 'brown'}"
    bos = runner.bos
    per_chunk = cfg.ctx - len(bos)
    n_chunks = -(-cfg.tokens // cfg.ctx)
    need = n_chunks * per_chunk
    ids, _ = read_documents(docs, runner.tokenize, need, cfg.read_order)
    if len(ids) < need:
        raise RidgefillError(f"text too short: --tokens {cfg.tokens} needs {need} text tokens, {source} has {len(ids)}")
    ids_arr = np.asarray(ids[:need], dtype=np.int32)
    return [np.concatenate([np.asarray(bos, dtype=np.int32), ids_arr[i * per_chunk:(i + 1) * per_chunk]])
            for i in range(n_chunks)]


def val_chunks(n_chunks: int, fraction: float) -> np.ndarray:
    """Which chunks are held out: spread evenly, at least one of each kind when fraction > 0."""
    is_val = np.floor((np.arange(n_chunks) + 1) * fraction) > np.floor(np.arange(n_chunks) * fraction)
    if fraction > 0 and not is_val.any():
        is_val[-1] = True
    return is_val


class Reservoir:
    """A uniform sample of at most k items (here: windows of consecutive held-out rows) from a stream, in fixed
    memory: the guard's held-out checks and the K/V diagnostics."""

    def __init__(self, k: int, shape: tuple[int, ...], seed: int):
        self.rows = np.empty((k, *shape), dtype=np.float32)
        self.k, self.seen, self.rng = k, 0, np.random.default_rng(seed)

    def add(self, rows: np.ndarray) -> None:
        for row in rows:
            if self.seen < self.k:
                self.rows[self.seen] = row
            else:
                j = self.rng.integers(0, self.seen + 1)
                if j < self.k:
                    self.rows[j] = row
            self.seen += 1

    @property
    def sample(self) -> np.ndarray:
        return self.rows[:min(self.seen, self.k)]


class Stopwatch:
    """Wall-clock seconds per phase, summed over the times a phase runs: `with clock("forward"): ...`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t


def calibrate(cfg: CalibConfig, out_path: str | Path | None = None) -> MapFile:
    """Fit the maps; the MapFile's extra also gets (not written to the file) peak_rss_mb and the seconds spent
    per phase: load_s, forward_s (the model), moments_s, solve_s (λ search and maps), diagnostics_s, write_s."""
    model = check_gguf(cfg.model)
    if cfg.map_type not in MAP_TYPES:
        raise RidgefillError(f"--map-type {cfg.map_type!r}: choose one of {', '.join(MAP_TYPES)}")
    kind, C = cfg.map_kind, cfg.context_tokens
    if kind not in MAP_KINDS:
        raise RidgefillError(f"--map-kind {kind!r}: choose one of {', '.join(MAP_KINDS)}")
    prior = cfg.prior or ("identity" if kind == "input" else "zero")
    if prior not in ridge.PRIORS:
        raise RidgefillError(f"--prior {prior!r}: choose one of {', '.join(ridge.PRIORS)}")
    if kind == "kv" and prior == "identity":
        raise RidgefillError("--prior identity needs --map-kind input (K/V maps have no identity to shrink "
                             "toward); use --prior zero")
    if not (isinstance(C, (int, np.integer)) and 0 <= C <= MAX_CONTEXT_TOKENS):
        raise RidgefillError(f"--context-tokens {C!r}: must be in 0..{MAX_CONTEXT_TOKENS}")
    if not 0 <= cfg.val_fraction < 1:
        raise RidgefillError("--val-fraction must be in [0, 1)")
    if cfg.read_order not in READ_ORDERS:
        raise RidgefillError(f"--read-order {cfg.read_order!r}: choose one of {', '.join(READ_ORDERS)}")
    if cfg.lam == "auto" and cfg.val_fraction == 0:
        raise RidgefillError("--lambda auto needs held-out tokens: set --val-fraction > 0")
    if cfg.lam != "auto" and not (isinstance(cfg.lam, (int, float)) and cfg.lam >= 0):
        raise RidgefillError(f"--lambda must be 'auto' or a number >= 0, not {cfg.lam!r}")
    check_band(cfg.split_layer, cfg.band_layers, cfg.band_window, cfg.band_full_layers)  # before the pass
    if not 0 <= cfg.sink_tokens < cfg.ctx - 1:
        raise RidgefillError(f"--sink-tokens must be in 0..{cfg.ctx - 2}")
    if cfg.sink_tokens < C:
        raise RidgefillError(f"--sink-tokens {cfg.sink_tokens} is less than --context-tokens {C}: the fitted "
                             f"tokens of a chunk need their {C} predecessors in it")
    reader = open_gguf(model)
    arch = field_value(reader, "general.architecture")
    n_layer = int(field_value(reader, f"{arch}.block_count"))
    s = cfg.split_layer
    if not 1 <= s <= n_layer - 1:
        raise RidgefillError(f"--split-layer {s} is outside 1..{n_layer - 1} ({model.name} has {n_layer} layers)")
    if out_path is not None:
        _AtomicOutput(out_path)  # an unwritable output fails now, not after the pass

    late = list(range(s + 1, n_layer))
    clock = Stopwatch()
    kvw, kv_dims = None, None
    if kind == "kv":                                               # the targets' projections, loaded once
        with clock("load"):
            kvw = [kvproj.load(reader, [l])[l] for l in late]
        dims = sorted({(w.wk.shape[0], w.wv.shape[0]) for w in kvw})
        if len(dims) != 1:
            raise RidgefillError(f"--map-kind kv needs the same K/V widths in every late layer; layers "
                                 f"{late[0]}..{late[-1]} have (d_k, d_v) {dims}")
        kv_dims = dims[0]
    # with a band, the maps read what the band passes them: fit them on it, where a chunk reaches past the window
    band_fed = cfg.band_layers > 0 and cfg.ctx > cfg.sink_tokens + cfg.band_window + 1
    with clock("load"):
        runner = LayerInputs(model, [s, *late], cfg.ctx, cfg.threads,
                             *((cfg.band_layers, cfg.band_window, cfg.sink_tokens, tuple(cfg.band_full_layers))
                               if band_fed else ()))
    chunks = token_budget(runner, cfg)
    is_val = val_chunks(len(chunks), cfg.val_fraction)
    if cfg.val_fraction > 0 and is_val.all():
        raise RidgefillError("--tokens too small: no chunk left for fitting after the held-out ones")
    d, L = runner.d, len(late)
    D = (C + 1) * d
    if kind == "kv":                                               # 2L targets: K(s+1), V(s+1), K(s+2), ...
        train, val = ridge.Moments(D, 2 * L, max(kv_dims)), ridge.Moments(D, 2 * L, max(kv_dims))
    else:
        train, val = ridge.Moments(D, L, d), ridge.Moments(D, L, d)
    # held-out windows of guard.WINDOW consecutive rows h_t, ..., h_{t-C}, then x_l: the guard's threshold, and
    # (as rows) the K/V diagnostics
    W_g = guard.WINDOW
    sample = Reservoir(max(2, cfg.diag_tokens // W_g), (W_g, C + 1 + L, d), cfg.seed)

    bar = tqdm(total=sum(len(c) for c in chunks), unit="tok", unit_scale=True, desc="calibrate",
               disable=not cfg.progress)
    for chunk, held_out in zip(chunks, is_val):
        with clock("forward"):
            acts = runner.run(chunk)                               # (1+L, n, d): h, then x_l, every position
        with clock("moments"):
            f = ridge.context_features(acts[0], C, cfg.sink_tokens)   # (n', D), rows of the fitted positions
            xs = acts[1:, cfg.sink_tokens:]
            ys = xs if kind == "input" else kv_targets(kvw, xs, max(kv_dims))
            (val if held_out else train).add(f, ys)
            if held_out:
                rows = np.concatenate([f.reshape(len(f), C + 1, d), xs.transpose(1, 0, 2)], axis=1)
                n_win = len(rows) // W_g
                sample.add(rows[:n_win * W_g].reshape(n_win, W_g, *rows.shape[1:]))
        bar.update(len(chunk))
    bar.close()
    del runner
    if not (train.is_finite() and val.is_finite()):
        raise RidgefillError("the layer inputs hold NaN or Inf; the model or its runtime is broken")

    with clock("solve"):
        if cfg.lam == "auto":
            lams, _ = ridge.pick_lambda(train, val, prior)         # per target: for kv λ_K, λ_V per layer
        else:
            lams = np.full(train.L, float(cfg.lam))
        W, b = ridge.solve(train, lams, prior, dtype=np.float32)   # maps are written as float32 (or smaller)
    n_train = train.n
    del train                                                      # the moments: not needed any more
    if not (np.isfinite(W).all() and np.isfinite(b).all()):
        raise RidgefillError("the ridge solve produced NaN or Inf (try a larger --lambda)")

    with clock("diagnostics"):
        windows = sample.sample
        rows = windows.reshape(-1, *windows.shape[2:])
        if not val.n:
            diag = {}
        elif kind == "kv":
            diag = kv_diagnostics(kvw, kv_dims, W, b, val, rows, C)
        else:
            diag = diagnostics(reader, late, W, b, val, rows, C)
        guard_data = guard.fit(*guard_sums(kind, kvw, W, b, windows, C)) if len(windows) >= 2 else None
    if kind == "kv":                                               # per layer: the K rows, then the V rows
        dk, dv = kv_dims
        W = np.concatenate([W[0::2, :dk], W[1::2, :dv]], axis=1)
        b = np.concatenate([b[0::2, :dk], b[1::2, :dv]], axis=1)
    m = MapFile(arch=arch, n_layer=n_layer, split_layer=s, prior=prior, ridge_lambda=lams,
                calib_tokens=n_train, sink_tokens=cfg.sink_tokens, base_fingerprint=fingerprint(reader),
                map_type=cfg.map_type, weights={l: W[i] for i, l in enumerate(late)},
                biases={l: b[i] for i, l in enumerate(late)}, diagnostics=diag,
                extra={"calib_ctx": cfg.ctx, "val_tokens": val.n, "calib_read_order": cfg.read_order,
                       "calib_source": ", ".join(map(str, cfg.texts)) or f"corpus:{cfg.corpus or 'brown'}",
                       "calib_split_input": "band" if band_fed else "exact"},
                version=__version__, map_kind=kind, context_tokens=C, kv_dims=kv_dims, guard=guard_data,
                band_layers=cfg.band_layers, band_window=cfg.band_window,
                band_full_layers=tuple(cfg.band_full_layers))
    if out_path is not None:
        with clock("write"):
            write_maps(out_path, m)
    m.extra["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m.extra.update({f"{phase}_s": sec for phase, sec in clock.seconds.items()})
    return m


def kv_targets(kvw: list[kvproj.KVWeights], xs: np.ndarray, width: int) -> np.ndarray:
    """K and V of late-layer inputs xs (L, n, d) through each layer's projections: (2L, n, width) targets
    K(s+1), V(s+1), K(s+2), ... (K heads one after another).  A narrower K or V is zero-padded to `width`:
    with the zero prior a zero column is fit by a zero row and adds nothing to any error, so this is exact."""
    L, n = xs.shape[:2]
    out = np.zeros((2 * L, n, width), dtype=np.float32)
    for i, (w, x) in enumerate(zip(kvw, xs)):
        k, v = kvproj.project(w, x)
        out[2 * i, :, :k.shape[1] * k.shape[2]] = k.reshape(n, -1)
        out[2 * i + 1, :, :v.shape[1]] = v
    return out


def guard_sums(kind: str, kvw, W: np.ndarray, b: np.ndarray, windows: np.ndarray, C: int):
    """The maps' error on each window (n, rows, C+1+L, d), per late layer and part, as the runtime measures it on
    canary rows: Σ|ŷ−y|², Σ|y|², each (n, L·P).  W, b as solved: per layer (input), or per target K(s+1), V(s+1),
    ... (kv)."""
    n, w, n_ctx = len(windows), windows.shape[1], C + 1
    f = windows[:, :, :n_ctx].reshape(n * w, -1)
    L = windows.shape[2] - n_ctx
    P = 2 if kind == "kv" else 1
    num, den = np.empty((n, L * P)), np.empty((n, L * P))
    for i in range(L):
        x = windows[:, :, n_ctx + i].reshape(n * w, -1)
        if kind == "kv":
            k, v = kvproj.project(kvw[i], x)
            targets = [(2 * i, k.reshape(n * w, -1)), (2 * i + 1, v)]
        else:
            targets = [(i, x)]
        for p, (t, y) in enumerate(targets):
            width = y.shape[1]
            y_hat = f @ W[t, :width].T.astype(np.float32) + b[t, :width].astype(np.float32)
            num[:, i * P + p], den[:, i * P + p] = guard.sums(y_hat.reshape(n, w, -1), y.reshape(n, w, -1))
    return num, den


def diagnostics(reader: GGUFReader, late: list[int], W: np.ndarray, b: np.ndarray,
                val: ridge.Moments, sample: np.ndarray, context_tokens: int = 0) -> dict[str, np.ndarray]:
    """Input maps, per late layer, on held-out tokens: R², relative error, K/V errors and key norm ratio;
    identity baseline (x̂_l = h_t) too.  sample: (n, C+1+L, d) rows h_t, ..., h_{t-C}, x_l."""
    L, n_ctx = len(late), context_tokens + 1
    total, base = ridge.sst(val), val.sxx
    sse, sse_id = ridge.sse(val, W, b), ridge.sse_identity(val)
    out = {"r2": 1 - sse / total, "rel_err": np.sqrt(sse / base),
           "identity_r2": 1 - sse_id / total, "identity_rel_err": np.sqrt(sse_id / base)}
    h, f = sample[:, 0], sample[:, :n_ctx].reshape(len(sample), -1)
    cols = {k: np.empty(L) for k in ("k_rel_err", "v_rel_err", "k_norm_ratio", "identity_k_rel_err",
                                     "identity_v_rel_err")}
    for i, l in enumerate(late):
        kv = kvproj.load(reader, [l])[l]                       # one layer's K/V weights at a time
        x = sample[:, n_ctx + i]
        x_hat = f @ W[i].T.astype(np.float32) + b[i].astype(np.float32)
        cols["k_rel_err"][i], cols["v_rel_err"][i], cols["k_norm_ratio"][i] = kvproj.kv_errors(kv, x_hat, x)
        cols["identity_k_rel_err"][i], cols["identity_v_rel_err"][i], _ = kvproj.kv_errors(kv, h, x)
    out.update(cols)
    return out


def kv_diagnostics(kvw: list[kvproj.KVWeights], kv_dims: tuple[int, int], W: np.ndarray, b: np.ndarray,
                   val: ridge.Moments, sample: np.ndarray, context_tokens: int) -> dict[str, np.ndarray]:
    """K/V maps, per late layer, on held-out tokens: relative error and R² of K and of V (from the held-out
    moments), key norm ratio (per head, on the sample) and the identity baseline (K/V of h_t through the layer's
    projections).  W (2L, e, D), b (2L, e): the solved targets K(s+1), V(s+1), ...; sample as in diagnostics."""
    n_ctx, dk = context_tokens + 1, kv_dims[0]
    sse, total, base = ridge.sse(val, W, b), ridge.sst(val), val.sxx
    out = {"k_rel_err": np.sqrt(sse[0::2] / base[0::2]), "v_rel_err": np.sqrt(sse[1::2] / base[1::2]),
           "k_r2": 1 - sse[0::2] / total[0::2], "v_r2": 1 - sse[1::2] / total[1::2]}
    h, f = sample[:, 0], sample[:, :n_ctx].reshape(len(sample), -1)
    cols = {k: np.empty(len(kvw)) for k in ("k_norm_ratio", "identity_k_rel_err", "identity_v_rel_err")}
    for i, w in enumerate(kvw):
        x = sample[:, n_ctx + i]
        k, _ = kvproj.project(w, x)
        k_hat = (f @ W[2 * i, :dk].T + b[2 * i, :dk].astype(np.float32)).reshape(k.shape)
        norms = np.linalg.norm(k_hat, axis=-1) / np.maximum(np.linalg.norm(k, axis=-1), 1e-30)
        cols["k_norm_ratio"][i] = float(norms.mean())
        cols["identity_k_rel_err"][i], cols["identity_v_rel_err"][i], _ = kvproj.kv_errors(w, h, x)
    out.update(cols)
    return out
