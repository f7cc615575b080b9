"""RidgeFill's GGUF files: the base-model fingerprint, map files (sidecar) and augmented models.

Tensors:  ridgefill.blk.{l}.map.weight  (d×d, f32|f16|q8_0; x̂_l = W h + b)
          ridgefill.blk.{l}.map.bias    (d, f32)        for every late layer l > split_layer
Keys:     ridgefill.* (see MapFile), plus general.type = "ridgefill_maps" in a sidecar.
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
from .modelfile import check_gguf

PREFIX = "ridgefill."
MAP_TENSOR = re.compile(r"ridgefill\.blk\.(\d+)\.map\.(weight|bias)")
MAP_TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16, "q8_0": GGMLQuantizationType.Q8_0}
DIAG_KEYS = ("r2", "rel_err", "k_rel_err", "v_rel_err", "k_norm_ratio",
             "identity_r2", "identity_rel_err", "identity_k_rel_err", "identity_v_rel_err")


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
    biases: dict[int, np.ndarray]     # late layer l -> b (d,)
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)  # DIAG_KEYS -> per late layer
    extra: dict[str, object] = field(default_factory=dict)           # other ridgefill.* scalars
    version: str = __version__

    @property
    def late_layers(self) -> list[int]:
        return list(range(self.split_layer + 1, self.n_layer))

    def validate(self) -> None:
        if not 1 <= self.split_layer <= self.n_layer - 1:
            raise RidgefillError(f"split_layer {self.split_layer} outside 1..{self.n_layer - 1}")
        if sorted(self.weights) != self.late_layers or sorted(self.biases) != self.late_layers:
            raise RidgefillError(f"maps must cover layers {self.split_layer + 1}..{self.n_layer - 1} exactly")
        d = None
        for l in self.late_layers:
            W, b = self.weights[l], self.biases[l]
            d = d or W.shape[1]
            if W.shape != (d, d) or b.shape != (d,):
                raise RidgefillError(f"layer {l}: map shapes {W.shape}/{b.shape}, expected ({d}, {d})/({d},)")
            if not (np.isfinite(W).all() and np.isfinite(b).all()):
                raise RidgefillError(f"layer {l}: map holds NaN or Inf")


def _add_keys(w: GGUFWriter, m: MapFile) -> None:
    w.add_string(PREFIX + "version", m.version)
    w.add_uint32(PREFIX + "split_layer", m.split_layer)
    w.add_uint32(PREFIX + "n_layer", m.n_layer)
    w.add_string(PREFIX + "prior", m.prior)
    w.add_array(PREFIX + "ridge_lambda", [float(x) for x in m.ridge_lambda])
    w.add_uint64(PREFIX + "calib_tokens", int(m.calib_tokens))
    w.add_uint32(PREFIX + "sink_tokens", int(m.sink_tokens))
    w.add_string(PREFIX + "base_fingerprint", m.base_fingerprint)
    w.add_string(PREFIX + "map_type", m.map_type)
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


def read_maps(path: str | Path) -> MapFile:
    """Read the maps of a sidecar or an augmented model (dequantized to float32)."""
    path = check_gguf(path)
    r = GGUFReader(path)
    if r.get_field(PREFIX + "split_layer") is None:
        raise RidgefillError(f"{path}: holds no RidgeFill maps (no ridgefill.split_layer key)")
    get = lambda k, d=None: field_value(r, PREFIX + k, d)  # noqa: E731
    tensors = {t.name: t for t in r.tensors if t.name.startswith(PREFIX)}
    weights, biases = {}, {}
    for name, t in tensors.items():
        m = MAP_TENSOR.fullmatch(name)
        if not m:
            raise RidgefillError(f"{path}: unexpected tensor {name!r} (map tensors are ridgefill.blk.N.map.weight|bias)")
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        (weights if m.group(2) == "weight" else biases)[int(m.group(1))] = arr
    known = {"version", "split_layer", "n_layer", "prior", "ridge_lambda", "calib_tokens", "sink_tokens",
             "base_fingerprint", "map_type"}
    diag, extra = {}, {}
    for key in r.fields:
        if key.startswith(PREFIX + "diag."):
            diag[key[len(PREFIX + "diag."):]] = np.asarray(r.fields[key].contents(), dtype=np.float64)
        elif key.startswith(PREFIX) and key[len(PREFIX):] not in known:
            extra[key[len(PREFIX):]] = r.fields[key].contents()
    m = MapFile(arch=field_value(r, "general.architecture", ""), n_layer=int(get("n_layer")),
                split_layer=int(get("split_layer")), prior=get("prior"),
                ridge_lambda=np.asarray(get("ridge_lambda"), dtype=np.float64),
                calib_tokens=int(get("calib_tokens")), sink_tokens=int(get("sink_tokens")),
                base_fingerprint=get("base_fingerprint"), map_type=get("map_type"),
                weights=weights, biases=biases, diagnostics=diag, extra=extra, version=get("version"))
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
              add_keys=None, extra_tensors=()) -> None:
    """Stream a GGUF into `path`: every key (renamed by `rename_key`) and tensor of `reader` unchanged,
    then `add_keys(writer)` and the `extra_tensors` [(name, array, GGMLQuantizationType)].

    Tensor data is written from the memory-mapped source, so a model is never loaded into RAM.
    """
    w = GGUFWriter(path, arch=arch or field_value(reader, "general.architecture"))
    w.data_alignment = int(field_value(reader, "general.alignment", w.data_alignment))
    add_fields(w, read_fields(reader), rename_key)
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


def export(model_path: str | Path, maps_path: str | Path, out_path: str | Path) -> None:
    """Write MODEL + maps as one augmented GGUF: the model's keys and tensors unchanged, ridgefill ones added."""
    model_path, maps_path = check_gguf(model_path), check_gguf(maps_path)
    if Path(out_path).resolve() in (model_path.resolve(), maps_path.resolve()):
        raise RidgefillError("the output must not overwrite an input")
    m = read_maps(maps_path)
    mr = GGUFReader(model_path)
    if any(t.name.startswith(PREFIX) for t in mr.tensors):
        raise RidgefillError(f"{model_path} already holds RidgeFill maps; export from the base model")
    check_maps_match(mr, model_path, m, maps_path)
    with _AtomicOutput(out_path) as tmp:
        copy_gguf(mr, tmp, add_keys=lambda w: _add_keys(w, m), extra_tensors=_map_tensors(m))


def info_text(path: str | Path) -> str:
    """The ridgefill metadata and per-layer diagnostics table of a map file or augmented model."""
    m = read_maps(path)
    lines = [f"file:             {path}",
             f"ridgefill:        {m.version}",
             f"architecture:     {m.arch}, {m.n_layer} layers",
             f"split_layer:      {m.split_layer} (maps for layers {m.split_layer + 1}..{m.n_layer - 1})",
             f"prior:            {m.prior}",
             f"map_type:         {m.map_type}",
             f"calib_tokens:     {m.calib_tokens}",
             f"sink_tokens:      {m.sink_tokens}",
             f"base_fingerprint: {m.base_fingerprint}"]
    lines += [f"{k + ':':17s} {v}" for k, v in sorted(m.extra.items())]
    lines += ["", diagnostics_table(m)]
    return "\n".join(lines)


def diagnostics_table(m: MapFile) -> str:
    d = m.diagnostics
    cols = [("layer", None), ("λ", m.ridge_lambda), ("R²", d.get("r2")), ("R² id", d.get("identity_r2")),
            ("rel err", d.get("rel_err")), ("K err", d.get("k_rel_err")), ("K err id", d.get("identity_k_rel_err")),
            ("V err", d.get("v_rel_err")), ("V err id", d.get("identity_v_rel_err")),
            ("|k̂|/|k|", d.get("k_norm_ratio"))]
    cols = [(n, v) for n, v in cols if n == "layer" or v is not None]
    head = " ".join(f"{n:>9s}" for n, _ in cols)
    rows = [head]
    for i, l in enumerate(m.late_layers):
        cells = [f"{l:>9d}"] + [f"{v[i]:>9.2g}" if n == "λ" else f"{v[i]:>9.4f}" for n, v in cols[1:]]
        rows.append(" ".join(cells))
    rows.append("(held-out tokens; 'id' = identity baseline x̂_l = h)")
    return "\n".join(rows)
