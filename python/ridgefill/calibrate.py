"""`ridgefill calibrate`: fit the ridge maps of one split layer in one forward pass over text.

The model runs chunk by chunk through the fork; for every token the inputs of the
split layer (h) and of each late layer (x_l) are captured, and only their float64
moments are kept (ridgefill.ridge.Moments), so memory does not grow with the
number of tokens.  Whole chunks are held out for validation (λ choice and
diagnostics); the first `sink_tokens` positions of every chunk are left out.

Memory (docs/scale.md): during the pass, the model's weights plus two sets of moments of
(L+1)·d²·8 bytes (L late layers, width d); then the model is freed, and the λ search
and the solve hold one layer's d×d temporaries at a time plus the maps in float32.
"""
from __future__ import annotations

import os
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from tqdm import tqdm

from . import data, kvproj, ridge
from ._lib import lib
from ._version import __version__
from .errors import RidgefillError
from .ggufio import MAP_TYPES, MapFile, _AtomicOutput, field_value, fingerprint, write_maps
from .modelfile import check_gguf


@dataclass
class CalibConfig:
    model: Path
    split_layer: int
    texts: list[Path] = field(default_factory=list)   # user text files
    corpus: str | None = None                         # or a registry corpus (ridgefill.data)
    tokens: int = 65536                               # tokens fed to the model
    ctx: int = 1024                                   # chunk length, BOS included
    lam: str | float = "auto"                         # relative λ, or "auto" (held-out grid search)
    prior: str = "identity"
    val_fraction: float = 0.1
    map_type: str = "f32"
    sink_tokens: int = 4
    threads: int | None = None
    diag_tokens: int = 1024                           # held-out tokens sampled for K/V diagnostics
    seed: int = 0
    progress: bool = True


class LayerInputs:
    """The model in the fork, capturing the inputs of layers `layers` for every token of a chunk."""

    def __init__(self, model: Path, layers: list[int], ctx: int, threads: int | None):
        from llama_cpp import Llama
        from llama_cpp import llama_cpp as C
        self.C = C
        # read, not mapped: on x86 llama.cpp repacks q4_0/q4_K weights into buffers of its own, and a mapping
        # would keep the file's copy resident too (8B shape, q4_0: peak RSS 14.2 GB mapped, see docs/scale.md)
        self.llm = Llama(model_path=str(model), n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, use_mmap=False,
                         n_threads=threads or os.cpu_count(), n_threads_batch=threads or os.cpu_count(),
                         verbose=False)
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
        C.llama_memory_clear(C.llama_get_memory(self.llm.ctx), True)
        arr = (C.llama_token * n)(*map(int, tokens))
        rc = C.llama_decode(self.llm.ctx, C.llama_batch_get_one(arr, n))
        if rc != 0:
            raise RidgefillError(f"llama_decode failed with {rc}")
        out = np.empty((len(self.layers), n, self.d), dtype=np.float32)
        for i, l in enumerate(self.layers):
            out[i] = np.ctypeslib.as_array(self._get(self.llm.ctx, l), shape=(n, self.d))
        return out


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
        docs = (d.text for d in data.corpus(cfg.corpus or "brown"))
        source = f"corpus {cfg.corpus or 'brown'}"
    bos = runner.bos
    per_chunk = cfg.ctx - len(bos)
    n_chunks = -(-cfg.tokens // cfg.ctx)
    need = n_chunks * per_chunk
    ids: list[int] = []
    for doc in docs:
        ids += runner.tokenize(doc + "\n\n")
        if len(ids) >= need:
            break
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
    """A uniform sample of at most k rows from a stream (fixed memory), for the K/V diagnostics."""

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
    reader = GGUFReader(model)
    arch = field_value(reader, "general.architecture")
    n_layer = int(field_value(reader, f"{arch}.block_count"))
    s = cfg.split_layer
    if not 1 <= s <= n_layer - 1:
        raise RidgefillError(f"--split-layer {s} is outside 1..{n_layer - 1} ({model.name} has {n_layer} layers)")
    if cfg.map_type not in MAP_TYPES:
        raise RidgefillError(f"--map-type {cfg.map_type!r}: choose one of {', '.join(MAP_TYPES)}")
    if cfg.prior not in ridge.PRIORS:
        raise RidgefillError(f"--prior {cfg.prior!r}: choose one of {', '.join(ridge.PRIORS)}")
    if not 0 <= cfg.val_fraction < 1:
        raise RidgefillError("--val-fraction must be in [0, 1)")
    if cfg.lam == "auto" and cfg.val_fraction == 0:
        raise RidgefillError("--lambda auto needs held-out tokens: set --val-fraction > 0")
    if cfg.lam != "auto" and not (isinstance(cfg.lam, (int, float)) and cfg.lam >= 0):
        raise RidgefillError(f"--lambda must be 'auto' or a number >= 0, not {cfg.lam!r}")
    if not 0 <= cfg.sink_tokens < cfg.ctx - 1:
        raise RidgefillError(f"--sink-tokens must be in 0..{cfg.ctx - 2}")
    if out_path is not None:
        _AtomicOutput(out_path)  # an unwritable output fails now, not after the pass

    late = list(range(s + 1, n_layer))
    clock = Stopwatch()
    with clock("load"):
        runner = LayerInputs(model, [s, *late], cfg.ctx, cfg.threads)
    chunks = token_budget(runner, cfg)
    is_val = val_chunks(len(chunks), cfg.val_fraction)
    if cfg.val_fraction > 0 and is_val.all():
        raise RidgefillError("--tokens too small: no chunk left for fitting after the held-out ones")
    d, L = runner.d, len(late)
    train, val = ridge.Moments(d, L), ridge.Moments(d, L)
    sample = Reservoir(cfg.diag_tokens, (L + 1, d), cfg.seed)

    bar = tqdm(total=sum(len(c) for c in chunks), unit="tok", unit_scale=True, desc="calibrate",
               disable=not cfg.progress)
    for chunk, held_out in zip(chunks, is_val):
        with clock("forward"):
            acts = runner.run(chunk)[:, cfg.sink_tokens:]          # (1+L, n, d): h, then x_l
        with clock("moments"):
            (val if held_out else train).add(acts[0], acts[1:])
            if held_out:
                sample.add(acts.transpose(1, 0, 2))
        bar.update(len(chunk))
    bar.close()
    del runner
    if not (train.is_finite() and val.is_finite()):
        raise RidgefillError("the layer inputs hold NaN or Inf; the model or its runtime is broken")

    with clock("solve"):
        if cfg.lam == "auto":
            lams, _ = ridge.pick_lambda(train, val, cfg.prior)
        else:
            lams = np.full(L, float(cfg.lam))
        W, b = ridge.solve(train, lams, cfg.prior, dtype=np.float32)   # maps are written as float32 (or smaller)
    n_train = train.n
    del train                                                      # L·d² float64: not needed any more
    if not (np.isfinite(W).all() and np.isfinite(b).all()):
        raise RidgefillError("the ridge solve produced NaN or Inf (try a larger --lambda)")

    with clock("diagnostics"):
        diag = diagnostics(reader, late, W, b, val, sample.sample) if val.n else {}
    m = MapFile(arch=arch, n_layer=n_layer, split_layer=s, prior=cfg.prior, ridge_lambda=lams,
                calib_tokens=n_train, sink_tokens=cfg.sink_tokens, base_fingerprint=fingerprint(reader),
                map_type=cfg.map_type, weights={l: W[i] for i, l in enumerate(late)},
                biases={l: b[i] for i, l in enumerate(late)}, diagnostics=diag,
                extra={"calib_ctx": cfg.ctx, "val_tokens": val.n,
                       "calib_source": ", ".join(map(str, cfg.texts)) or f"corpus:{cfg.corpus or 'brown'}"},
                version=__version__)
    if out_path is not None:
        with clock("write"):
            write_maps(out_path, m)
    m.extra["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m.extra.update({f"{phase}_s": sec for phase, sec in clock.seconds.items()})
    return m


def diagnostics(reader: GGUFReader, late: list[int], W: np.ndarray, b: np.ndarray,
                val: ridge.Moments, sample: np.ndarray) -> dict[str, np.ndarray]:
    """Per late layer, on held-out tokens: R², relative error, K/V errors and key norm ratio; identity baseline too."""
    L = len(late)
    total, base = ridge.sst(val), val.sxx
    sse, sse_id = ridge.sse(val, W, b), ridge.sse_identity(val)
    out = {"r2": 1 - sse / total, "rel_err": np.sqrt(sse / base),
           "identity_r2": 1 - sse_id / total, "identity_rel_err": np.sqrt(sse_id / base)}
    h = sample[:, 0]
    cols = {k: np.empty(L) for k in ("k_rel_err", "v_rel_err", "k_norm_ratio", "identity_k_rel_err",
                                     "identity_v_rel_err")}
    for i, l in enumerate(late):
        kv = kvproj.load(reader, [l])[l]                       # one layer's K/V weights at a time
        x = sample[:, i + 1]
        x_hat = h @ W[i].T.astype(np.float32) + b[i].astype(np.float32)
        cols["k_rel_err"][i], cols["v_rel_err"][i], cols["k_norm_ratio"][i] = kvproj.kv_errors(kv, x_hat, x)
        cols["identity_k_rel_err"][i], cols["identity_v_rel_err"][i], _ = kvproj.kv_errors(kv, h, x)
    out.update(cols)
    return out
