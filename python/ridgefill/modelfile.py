"""Checks on a model file before the engine sees it, so bad input gets a clear message."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import RidgefillError

GGUF_MAGIC = b"GGUF"


def check_gguf(path: str | Path) -> Path:
    """Return `path` if it is a complete GGUF file, else raise RidgefillError naming the problem."""
    path = Path(path)
    if not path.exists():
        raise RidgefillError(f"{path}: no such file")
    if not path.is_file():
        raise RidgefillError(f"{path}: not a file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise RidgefillError(f"{path}: not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r})")
    from gguf import GGUFReader
    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - GGUFReader raises many kinds on a damaged header
        raise RidgefillError(f"{path}: damaged or truncated GGUF ({size} bytes): {e}") from e
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise RidgefillError(f"{path}: truncated GGUF: its tensors need {end} bytes, the file has {size}")
    del reader
    return path


def read_arch(path: str | Path) -> str:
    from gguf import GGUFReader
    field = GGUFReader(path).get_field("general.architecture")
    return bytes(np.asarray(field.parts[field.data[0]])).decode()
