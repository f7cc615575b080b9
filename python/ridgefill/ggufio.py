"""RidgeFill's GGUF files: the base-model fingerprint, map files (sidecar) and augmented models.

Tensors, for every late layer l > split_layer (numpy shapes; GGUF ne is the reverse):
          ridgefill.blk.{l}.map.weight  W (d_out, D), f32|f16|q8_0
          ridgefill.blk.{l}.map.bias    b (d_out,), f32
  with features f_t = [h_t, h_{t-1}, ..., h_{t-C}] (D = (C+1)·d, C = context_tokens, h the split layer's input):
  map_kind "input": d_out = d,          x̂_l = W f_t + b
  map_kind "kv":    d_out = d_k + d_v,  W f_t + b = [k_l; v_l]: rows [0, d_k) are K (after any k-norm, before
                    RoPE, heads one after another), rows [d_k, d_k + d_v) are V
Keys:     ridgefill.* (see MapFile and _add_keys), plus general.type = "ridgefill_maps" in a sidecar.  Format 2
          added format_version (u32; absent: 1), map_kind ("input"|"kv"; absent: "input"), context_tokens (u32;
          absent: 0) and, for kv, kv_dims [d_k, d_v] (u32).  ridge_lambda holds one λ per late layer, or for kv
          two, interleaved [λ_K(s+1), λ_V(s+1), λ_K(s+2), ...].  A format 1 file is read as input maps, C = 0.
Guard:    optional (files calibrated before it lack them; the runtime's guard is then off):
          ridgefill.guard.window (u32) rows per check; guard.layer_error (f32, per late layer and part: the
          held-out relative squared error Σ|ŷ−y|²/Σ|y|², parts x, or K then V); guard.threshold (f32);
          guard.scores (f32) the held-out checks' scores, sorted; guard.layer_error_q (f32, per late layer and
          part: the 50/90/100% quantiles of the held-out checks' error over layer_error); guard.rule (string).
Band:     optional ridgefill.band_layers, band_window (u32; absent: 0, no band): the runtime's default windowed
          band (the band_layers layers below split_layer run on the filled rows with attention over the sink and
          band_window latest positions; the maps read their output).  A reader that ignores them computes those
          layers exactly: slower, never wrong.  Format 3 added band_full_layers (u32 array, ascending, inside the
          band): band layers that attend to every position, as exact layers do.  A file holding it is written as
          format 3, so that a reader that knows the band but not this key refuses it instead of windowing them;
          every other file is still written as format 2.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from ._version import __version__
from .errors import RidgefillError
from .modelfile import check_gguf, open_gguf

PREFIX = "ridgefill."
MAP_TENSOR = re.compile(r"ridgefill\.blk\.(\d+)\.map\.(weight|bias)")
MAP_TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16, "q8_0": GGMLQuantizationType.Q8_0}
DIAG_KEYS = ("r2", "rel_err", "k_rel_err", "v_rel_err", "k_norm_ratio",
             "identity_r2", "identity_rel_err", "identity_k_rel_err", "identity_v_rel_err")
KV_DIAG_KEYS = ("k_rel_err", "v_rel_err", "k_norm_ratio", "k_r2", "v_r2", "identity_k_rel_err", "identity_v_rel_err")
FORMAT_VERSION = 3                   # the newest read_maps reads (write_maps: _format_version)
MAP_KINDS = ("input", "kv")
MAX_CONTEXT_TOKENS = 2


def weight_name(layer: int) -> str:
    return f"ridgefill.blk.{layer}.map.weight"


def bias_name(layer: int) -> str:
    return f"ridgefill.blk.{layer}.map.bias"


def field_value(reader: GGUFReader, key: str, default=None):
    f = reader.get_field(key)
    return default if f is None else f.contents()


def fingerprint(reader: GGUFReader) -> str:
    """Identity of a base model: architecture, every tensor's name/type/shape, and samples of its data.

    ridgefill.* tensors are left out, so an augmented model has its base's fingerprint.  Data is
    sampled (first, middle and last 4 KiB of each tensor) so that the runtime can check it quickly.
    """
    h = hashlib.sha256(b"ridgefill-fingerprint-v1\n")
    h.update(f"arch={field_value(reader, 'general.architecture', '')}\n".encode())
    tensors = sorted((t for t in reader.tensors if not t.name.startswith(PREFIX)), key=lambda t: t.name)
    for t in tensors:
        ne = [int(n) for n in t.shape]
        while len(ne) > 1 and ne[-1] == 1:  # as ggml_n_dims counts them
            ne.pop()
        h.update(f"{t.name} {int(t.tensor_type)} {','.join(map(str, ne))}\n".encode())
    for t in tensors:
        start, n = int(t.data_offset), int(t.n_bytes)
        spans = [(0, n)] if n <= 3 * 4096 else [(0, 4096), (n // 2 - 2048, 4096), (n - 4096, 4096)]
        for off, length in spans:
            h.update(reader.data[start + off:start + off + length].tobytes())
    return "sha256:" + h.hexdigest()


@dataclass
class Guard:
    """What the runtime's out-of-distribution guard needs, from the calibration's held-out text: per late layer
    and part the relative squared error (the score's unit), the threshold, and the distribution it came from."""
    window: int                       # rows per check
    layer_error: np.ndarray           # (L·P,) Σ|ŷ−y|²/Σ|y|² on held-out rows; P = 1 (x) or 2 (K, V)
    threshold: float
    scores: np.ndarray                # the held-out checks' scores, sorted
    layer_error_q: np.ndarray         # (L·P, 3): 50/90/100% quantiles of a check's error / layer_error
    rule: str = ""


@dataclass
class MapFile:
    """Everything a map file holds; plain arrays in, plain arrays out."""
    arch: str
    n_layer: int
    split_layer: int
    prior: str
    ridge_lambda: np.ndarray          # relative λ per late layer (see ridgefill.ridge)
    calib_tokens: int
    sink_tokens: int
    base_fingerprint: str
    map_type: str
    weights: dict[int, np.ndarray]    # late layer l -> W (d_out, d_in), float32 (dequantized when read)
    biases: dict[int, np.ndarray]     # late layer l -> b (d_out,)
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)  # DIAG_KEYS (KV_DIAG_KEYS) -> per late layer
    extra: dict[str, object] = field(default_factory=dict)           # other ridgefill.* scalars
    version: str = __version__
    map_kind: str = "input"           # what W predicts: the layer input x_l, or its K and V ("kv")
    context_tokens: int = 0           # C: predecessors whose split-layer states are features too
    kv_dims: tuple[int, int] | None = None   # kv: (d_k, d_v), the rows of K and of V in W
    format_version: int = FORMAT_VERSION     # of the file read (write_maps writes _format_version)
    guard: Guard | None = None               # the out-of-distribution guard's data (None: no guard)
    band_layers: int = 0                     # the runtime's default windowed band below split_layer (0: none)
    band_window: int = 0                     # positions a band layer of a filled row attends to, besides the sink
    band_full_layers: tuple[int, ...] = ()   # band layers that attend to every position (ascending, inside the band)

    @property
    def late_layers(self) -> list[int]:
        return list(range(self.split_layer + 1, self.n_layer))

    def validate(self) -> None:
        if self.format_version > FORMAT_VERSION:
            raise RidgefillError(f"map format version {self.format_version} is newer than this ridgefill reads "
                                 f"({FORMAT_VERSION}); upgrade ridgefill")
        if self.map_kind not in MAP_KINDS:
            raise RidgefillError(f"map_kind {self.map_kind!r} is unknown (expected one of {', '.join(MAP_KINDS)})")
        if not 0 <= self.context_tokens <= MAX_CONTEXT_TOKENS:
            raise RidgefillError(f"context_tokens {self.context_tokens} outside 0..{MAX_CONTEXT_TOKENS}")
        if not 1 <= self.split_layer <= self.n_layer - 1:
            raise RidgefillError(f"split_layer {self.split_layer} outside 1..{self.n_layer - 1}")
        check_band(self.split_layer, self.band_layers, self.band_window, self.band_full_layers)
        if sorted(self.weights) != self.late_layers or sorted(self.biases) != self.late_layers:
            raise RidgefillError(f"maps must cover layers {self.split_layer + 1}..{self.n_layer - 1} exactly")
        L, n_ctx = len(self.late_layers), self.context_tokens + 1
        n_lam = 2 * L if self.map_kind == "kv" else L
        if len(self.ridge_lambda) != n_lam:
            raise RidgefillError(f"ridge_lambda has {len(self.ridge_lambda)} entries, expected {n_lam} "
                                 f"({self.map_kind} maps for {L} layers)")
        for l in self.late_layers:
            if self.weights[l].ndim != 2:
                raise RidgefillError(f"layer {l}: map weight has shape {self.weights[l].shape}, expected 2 dimensions")
        first = self.weights[self.late_layers[0]].shape
        if self.map_kind == "kv":                 # (d_k + d_v, D), D the same in every layer
            if self.prior == "identity":
                raise RidgefillError("kv maps cannot have the identity prior (it needs map_kind input)")
            if self.kv_dims is None or len(self.kv_dims) != 2 or min(self.kv_dims) < 1:
                raise RidgefillError(f"kv maps need kv_dims (d_k, d_v), not {self.kv_dims}")
            d_out, D = sum(self.kv_dims), first[1]
            if D % n_ctx:
                raise RidgefillError(f"map input width {D} is not a multiple of context_tokens + 1 = {n_ctx}")
        else:                                     # (d, (C+1)·d)
            d_out, D = first[0], n_ctx * first[0]
        for l in self.late_layers:
            W, b = self.weights[l], self.biases[l]
            if W.shape != (d_out, D) or b.shape != (d_out,):
                raise RidgefillError(f"layer {l}: map shapes {W.shape}/{b.shape}, expected ({d_out}, {D})/({d_out},) "
                                     f"for {self.map_kind} maps with context_tokens {self.context_tokens}")
            if not (np.isfinite(W).all() and np.isfinite(b).all()):
                raise RidgefillError(f"layer {l}: map holds NaN or Inf")
        if self.guard is not None:
            g, n = self.guard, L * (2 if self.map_kind == "kv" else 1)
            if not (g.window > 0 and np.shape(g.layer_error) == (n,) and np.all(np.asarray(g.layer_error) > 0)
                    and np.isfinite(g.threshold) and g.threshold > 0):
                raise RidgefillError(f"guard data malformed: window {g.window}, {np.size(g.layer_error)} layer errors "
                                     f"(expected {n} positive), threshold {g.threshold}")


def check_band(split_layer: int, band_layers: int, band_window: int, band_full_layers=()) -> None:
    if not 0 <= band_layers <= split_layer:
        raise RidgefillError(f"band_layers {band_layers} outside 0..{split_layer} (the band is made of layers below the "
                             f"split layer {split_layer})")
    if band_layers > 0 and band_window < 1:
        raise RidgefillError(f"band_window {band_window}: a band of {band_layers} layers needs a window of at least 1")
    full = list(band_full_layers)
    band = range(split_layer - band_layers, split_layer)
    if any(l not in band for l in full) or full != sorted(set(full)):
        raise RidgefillError(f"band_full_layers {full}: must be ascending layers of the band "
                             + (f"{band.start}..{band.stop - 1}" if band_layers
                                else "(there is no band: band_layers 0)"))


def _format_version(m: MapFile) -> int:
    """What write_maps writes: 3 only for a file that needs it (band_full_layers), else 2."""
    return 3 if m.band_full_layers else 2


def _add_keys(w: GGUFWriter, m: MapFile) -> None:
    w.add_uint32(PREFIX + "format_version", _format_version(m))
    w.add_string(PREFIX + "map_kind", m.map_kind)
    w.add_uint32(PREFIX + "context_tokens", int(m.context_tokens))
    if m.map_kind == "kv":
        w.add_key_value(PREFIX + "kv_dims", [int(x) for x in m.kv_dims], GGUFValueType.ARRAY,
                        sub_type=GGUFValueType.UINT32)
    w.add_string(PREFIX + "version", m.version)
    w.add_uint32(PREFIX + "split_layer", m.split_layer)
    w.add_uint32(PREFIX + "n_layer", m.n_layer)
    w.add_string(PREFIX + "prior", m.prior)
    w.add_array(PREFIX + "ridge_lambda", [float(x) for x in m.ridge_lambda])
    w.add_uint64(PREFIX + "calib_tokens", int(m.calib_tokens))
    w.add_uint32(PREFIX + "sink_tokens", int(m.sink_tokens))
    w.add_string(PREFIX + "base_fingerprint", m.base_fingerprint)
    w.add_string(PREFIX + "map_type", m.map_type)
    if m.band_layers > 0:
        w.add_uint32(PREFIX + "band_layers", int(m.band_layers))
        w.add_uint32(PREFIX + "band_window", int(m.band_window))
    if m.band_full_layers:
        w.add_key_value(PREFIX + "band_full_layers", [int(x) for x in m.band_full_layers], GGUFValueType.ARRAY,
                        sub_type=GGUFValueType.UINT32)
    if m.guard is not None:
        g = m.guard
        w.add_uint32(PREFIX + "guard.window", int(g.window))
        w.add_array(PREFIX + "guard.layer_error", [float(x) for x in g.layer_error])
        w.add_float32(PREFIX + "guard.threshold", float(g.threshold))
        w.add_array(PREFIX + "guard.scores", [float(x) for x in g.scores])
        w.add_array(PREFIX + "guard.layer_error_q", [float(x) for x in np.ravel(g.layer_error_q)])
        w.add_string(PREFIX + "guard.rule", g.rule)
    for k, v in m.diagnostics.items():
        w.add_array(PREFIX + "diag." + k, [float(x) for x in v])
    for k, v in m.extra.items():
        if isinstance(v, str):
            w.add_string(PREFIX + k, v)
        elif isinstance(v, int):
            w.add_uint64(PREFIX + k, v)
        else:
            w.add_float32(PREFIX + k, float(v))


def _map_tensors(m: MapFile) -> list[tuple[str, np.ndarray, GGMLQuantizationType]]:
    qtype = MAP_TYPES[m.map_type]
    out = []
    for l in m.late_layers:
        W = np.ascontiguousarray(m.weights[l], dtype=np.float32)
        if qtype == GGMLQuantizationType.F16:
            W = W.astype(np.float16)
        elif qtype == GGMLQuantizationType.Q8_0:
            W = quantize(W, qtype)
        out.append((weight_name(l), W, qtype))
        out.append((bias_name(l), np.ascontiguousarray(m.biases[l], dtype=np.float32), GGMLQuantizationType.F32))
    return out


class _AtomicOutput:
    """Write to a temp file beside `path`; rename on success, remove on failure."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise RidgefillError(f"cannot write {self.path}: directory {self.path.parent} does not exist")
        if not os.access(self.path.parent, os.W_OK):
            raise RidgefillError(f"cannot write {self.path}: directory {self.path.parent} is not writable")
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


def write_maps(path: str | Path, m: MapFile) -> None:
    """Write a sidecar map file."""
    m.validate()
    with _AtomicOutput(path) as tmp:
        w = GGUFWriter(tmp, arch=m.arch)
        w.add_type("ridgefill_maps")
        _add_keys(w, m)
        for name, data, qtype in _map_tensors(m):
            w.add_tensor(name, data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def _format_keys(path: Path, get) -> tuple[int, str, int, tuple[int, int] | None]:
    """(format_version, map_kind, context_tokens, kv_dims) of a map file, defaults for a format 1 file."""
    version, kind, ctx, dims = get("format_version", 1), get("map_kind", "input"), get("context_tokens", 0), None
    if not isinstance(version, int) or version < 1:
        raise RidgefillError(f"{path}: ridgefill.format_version {version!r} is not a format version")
    if version > FORMAT_VERSION:
        raise RidgefillError(f"{path}: map format version {version} is newer than this ridgefill reads "
                             f"({FORMAT_VERSION}); upgrade ridgefill to use these maps")
    if kind not in MAP_KINDS:
        raise RidgefillError(f"{path}: ridgefill.map_kind {kind!r} is unknown (expected one of {', '.join(MAP_KINDS)})")
    if not isinstance(ctx, int) or not 0 <= ctx <= MAX_CONTEXT_TOKENS:
        raise RidgefillError(f"{path}: ridgefill.context_tokens {ctx!r} outside 0..{MAX_CONTEXT_TOKENS}")
    if kind == "kv":
        dims = get("kv_dims")
        if not (isinstance(dims, list) and len(dims) == 2 and all(isinstance(x, int) and x > 0 for x in dims)):
            raise RidgefillError(f"{path}: kv maps need ridgefill.kv_dims [d_k, d_v], not {dims!r}")
        dims = (int(dims[0]), int(dims[1]))
    return version, kind, ctx, dims


def read_maps(path: str | Path) -> MapFile:
    """Read the maps of a sidecar or an augmented model (dequantized to float32)."""
    path = check_gguf(path)
    r = open_gguf(path)
    if r.get_field(PREFIX + "split_layer") is None:
        raise RidgefillError(f"{path}: holds no RidgeFill maps (no ridgefill.split_layer key)")
    get = lambda k, d=None: field_value(r, PREFIX + k, d)  # noqa: E731
    version, kind, ctx, dims = _format_keys(path, get)
    tensors = {t.name: t for t in r.tensors if t.name.startswith(PREFIX)}
    weights, biases = {}, {}
    for name, t in tensors.items():
        m = MAP_TENSOR.fullmatch(name)
        if not m:
            raise RidgefillError(f"{path}: unexpected tensor {name!r} (map tensors are ridgefill.blk.N.map.weight|bias)")
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        (weights if m.group(2) == "weight" else biases)[int(m.group(1))] = arr
    known = {"version", "split_layer", "n_layer", "prior", "ridge_lambda", "calib_tokens", "sink_tokens",
             "base_fingerprint", "map_type", "format_version", "map_kind", "context_tokens", "kv_dims",
             "band_layers", "band_window", "band_full_layers"}
    diag, extra = {}, {}
    guard = None
    if get("guard.window") is not None:
        arr = lambda k: np.asarray(get("guard." + k, []), dtype=np.float64)  # noqa: E731
        if arr("layer_error_q").size != 3 * arr("layer_error").size:
            raise RidgefillError(f"{path}: ridgefill.guard.layer_error_q must hold 3 quantiles per layer_error entry")
        guard = Guard(window=int(get("guard.window")), layer_error=arr("layer_error"),
                      threshold=float(get("guard.threshold", float("nan"))), scores=arr("scores"),
                      layer_error_q=arr("layer_error_q").reshape(-1, 3), rule=str(get("guard.rule", "")))
    for key in r.fields:
        if key.startswith(PREFIX + "guard."):
            continue
        if key.startswith(PREFIX + "diag."):
            diag[key[len(PREFIX + "diag."):]] = np.asarray(r.fields[key].contents(), dtype=np.float64)
        elif key.startswith(PREFIX) and key[len(PREFIX):] not in known:
            extra[key[len(PREFIX):]] = r.fields[key].contents()
    m = MapFile(arch=field_value(r, "general.architecture", ""), n_layer=int(get("n_layer")),
                split_layer=int(get("split_layer")), prior=get("prior"),
                ridge_lambda=np.asarray(get("ridge_lambda"), dtype=np.float64),
                calib_tokens=int(get("calib_tokens")), sink_tokens=int(get("sink_tokens")),
                base_fingerprint=get("base_fingerprint"), map_type=get("map_type"),
                weights=weights, biases=biases, diagnostics=diag, extra=extra, version=get("version"),
                map_kind=kind, context_tokens=ctx, kv_dims=dims, format_version=version, guard=guard,
                band_layers=int(get("band_layers", 0)), band_window=int(get("band_window", 0)),
                band_full_layers=tuple(int(x) for x in get("band_full_layers", [])))
    m.validate()
    return m


def check_maps_match(model_reader: GGUFReader, model_path: Path, m: MapFile, maps_path: Path) -> None:
    fp = fingerprint(model_reader)
    if fp != m.base_fingerprint:
        raise RidgefillError(f"{maps_path} holds maps for another model (fingerprint {m.base_fingerprint[:19]}…), "
                             f"not for {model_path} ({fp[:19]}…)")


def read_fields(reader: GGUFReader, keep=lambda k: True) -> list[tuple[str, object, GGUFValueType, object]]:
    """The keys of `reader` that `keep` accepts as plain data: (name, value, type, array item type), never the
    GGUF.* pseudo-keys nor general.architecture (which GGUFWriter writes itself)."""
    return [(f.name, f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
            for f in reader.fields.values()
            if not (f.name.startswith("GGUF.") or f.name == "general.architecture") and keep(f.name)]


def add_fields(w: GGUFWriter, fields, rename_key=lambda k: k) -> None:
    """Add keys as read_fields returns them to `w`, renamed by `rename_key`."""
    for name, value, vtype, sub in fields:
        w.add_key_value(rename_key(name), value, vtype, sub_type=sub)


def copy_gguf(reader: GGUFReader, path: str | Path, *, arch: str | None = None, rename_key=lambda k: k,
              add_keys=None, extra_tensors=(), keep_key=lambda k: True) -> None:
    """Stream a GGUF into `path`: every key that `keep_key` accepts (renamed by `rename_key`) and every tensor
    of `reader` unchanged, then `add_keys(writer)` and the `extra_tensors` [(name, array, GGMLQuantizationType)].

    Tensor data is written from the memory-mapped source, so a model is never loaded into RAM.
    """
    w = GGUFWriter(path, arch=arch or field_value(reader, "general.architecture"))
    w.data_alignment = int(field_value(reader, "general.alignment", w.data_alignment))
    add_fields(w, read_fields(reader, keep_key), rename_key)
    if add_keys:
        add_keys(w)
    for t in reader.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, raw_dtype=t.tensor_type)
    for name, data, qtype in extra_tensors:
        w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in reader.tensors:
        w.write_tensor_data(t.data)
    for _, data, _ in extra_tensors:
        w.write_tensor_data(data)
    w.close()


# llama.cpp's general.file_type of a model whose weights are mostly of one type (llama_ftype)
_FILE_TYPE = {GGMLQuantizationType.F32: 0, GGMLQuantizationType.F16: 1, GGMLQuantizationType.Q4_0: 2,
              GGMLQuantizationType.Q8_0: 7}


def requantize(src: str | Path, dst: str | Path, to: str = "Q8_0", only: tuple[str, ...] = ("Q4_1",)) -> Path:
    """Copy the GGUF at `src` to `dst` with its tensors of the types in `only` re-encoded as `to` (dequantized, then
    quantized by gguf-py): the same weights up to `to`'s rounding, every key and other tensor unchanged.

    The tests run SmolLM2 so: its package ships Q4_1, which llama.cpp's fast x86 prompt kernels do not cover, and
    its Q8_0 re-encoding processes prompts twice as fast on 2 cores (224 vs 442 tokens/s, 2026-12-03) and predicts
    as the package's file does (tests/test_models.py)."""
    for name in (to, *only):
        if name not in GGMLQuantizationType.__members__:
            raise RidgefillError(f"requantize: {name!r} is not a GGML tensor type (e.g. Q8_0, Q4_1, F16, F32)")
    qto, kinds = GGMLQuantizationType[to], {GGMLQuantizationType[k] for k in only}
    reader = open_gguf(check_gguf(src))
    tensors = [(t.name, quantize(dequantize(t.data, t.tensor_type), qto), qto) if t.tensor_type in kinds
               else (t.name, t.data, t.tensor_type) for t in reader.tensors]
    with _AtomicOutput(dst) as tmp:
        w = GGUFWriter(tmp, arch=field_value(reader, "general.architecture"))
        w.data_alignment = int(field_value(reader, "general.alignment", w.data_alignment))
        add_fields(w, read_fields(reader, lambda k: k != "general.file_type"))
        if qto in _FILE_TYPE:
            w.add_file_type(_FILE_TYPE[qto])
        for name, data, qtype in tensors:
            w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, data, _ in tensors:
            w.write_tensor_data(data)
        w.close()
    return Path(dst)


def export(model_path: str | Path, maps_path: str | Path, out_path: str | Path) -> None:
    """Write MODEL + maps as one augmented GGUF: the model's keys and tensors unchanged, ridgefill ones added."""
    model_path, maps_path = check_gguf(model_path), check_gguf(maps_path)
    if Path(out_path).resolve() in (model_path.resolve(), maps_path.resolve()):
        raise RidgefillError("the output must not overwrite an input")
    m = read_maps(maps_path)
    mr = open_gguf(model_path)
    if any(t.name.startswith(PREFIX) for t in mr.tensors):
        raise RidgefillError(f"{model_path} already holds RidgeFill maps; export from the base model")
    check_maps_match(mr, model_path, m, maps_path)
    with _AtomicOutput(out_path) as tmp:
        copy_gguf(mr, tmp, add_keys=lambda w: _add_keys(w, m), extra_tensors=_map_tensors(m))


def info_text(path: str | Path) -> str:
    """The ridgefill metadata and per-layer diagnostics table of a map file or augmented model."""
    m = read_maps(path)
    D = m.weights[m.late_layers[0]].shape[1]
    kind = ("kv (each late layer's K, before RoPE, and V)" if m.map_kind == "kv"
            else "input (each late layer's input)")
    lines = [f"file:             {path}",
             f"ridgefill:        {m.version}",
             f"format_version:   {m.format_version}",
             f"architecture:     {m.arch}, {m.n_layer} layers",
             f"split_layer:      {m.split_layer} (maps for layers {m.split_layer + 1}..{m.n_layer - 1})",
             f"map_kind:         {kind}",
             f"context_tokens:   {m.context_tokens} (features: split-layer states of the token and "
             f"{m.context_tokens} before it, width {D})",
             f"band:             " + (f"layers {m.split_layer - m.band_layers}..{m.split_layer - 1} of filled rows "
                                      f"attend to the sink and their {m.band_window} latest positions"
                                      + (f"; layers {', '.join(map(str, m.band_full_layers))} attend to every "
                                         "position" if m.band_full_layers else "")
                                      if m.band_layers else "none"),
             f"prior:            {m.prior}",
             f"map_type:         {m.map_type}",
             f"calib_tokens:     {m.calib_tokens}",
             f"sink_tokens:      {m.sink_tokens}",
             f"base_fingerprint: {m.base_fingerprint}"]
    if m.map_kind == "kv":
        lines.insert(6, f"kv_dims:          {m.kv_dims[0]} {m.kv_dims[1]} (d_k d_v)")
    lines += [f"{k + ':':17s} {v}" for k, v in sorted(m.extra.items())]
    if m.guard is None:
        lines.append("guard:            none (calibrated before the out-of-distribution guard: it stays off)")
    else:
        g = m.guard
        lines.append(f"guard:            {g.window}-row checks, threshold {g.threshold:.2f}; held-out check scores "
                     f"median {np.median(g.scores):.2f}, max {g.scores.max():.2f} ({len(g.scores)} windows); "
                     f"rule: {g.rule}")
    lines += ["", diagnostics_table(m)]
    return "\n".join(lines)


def diagnostics_table(m: MapFile) -> str:
    d = m.diagnostics
    if m.map_kind == "kv":
        cols = [("layer", None), ("λ K", m.ridge_lambda[0::2]), ("λ V", m.ridge_lambda[1::2]),
                ("R² K", d.get("k_r2")), ("R² V", d.get("v_r2")),
                ("K err", d.get("k_rel_err")), ("K err id", d.get("identity_k_rel_err")),
                ("V err", d.get("v_rel_err")), ("V err id", d.get("identity_v_rel_err")),
                ("|k̂|/|k|", d.get("k_norm_ratio"))]
        note = "(held-out tokens; 'id' = identity baseline: K/V of h through the layer's own projections)"
    else:
        cols = [("layer", None), ("λ", m.ridge_lambda), ("R²", d.get("r2")), ("R² id", d.get("identity_r2")),
                ("rel err", d.get("rel_err")), ("K err", d.get("k_rel_err")),
                ("K err id", d.get("identity_k_rel_err")), ("V err", d.get("v_rel_err")),
                ("V err id", d.get("identity_v_rel_err")), ("|k̂|/|k|", d.get("k_norm_ratio"))]
        note = "(held-out tokens; 'id' = identity baseline x̂_l = h)"
    cols = [(n, v) for n, v in cols if n == "layer" or v is not None]
    head = " ".join(f"{n:>9s}" for n, _ in cols)
    rows = [head]
    for i, l in enumerate(m.late_layers):
        cells = [f"{l:>9d}"] + [f"{v[i]:>9.2g}" if n.startswith("λ") else f"{v[i]:>9.4f}" for n, v in cols[1:]]
        rows.append(" ".join(cells))
    rows.append(note)
    return "\n".join(rows)
