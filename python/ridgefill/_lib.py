"""ctypes access to what the fork adds to libllama (declared in cpp/ridgefill.h).

The library is the one the `llama_cpp` bindings loaded, so Python, the bindings
and our functions always talk to the same build.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

from .errors import RidgefillError


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    try:
        from llama_cpp import llama_cpp as bindings
    except Exception as e:  # noqa: BLE001 - report any import failure as one line
        raise RidgefillError(f"cannot load the llama_cpp bindings: {e}") from e
    handle = bindings._lib
    if not hasattr(handle, "llama_ridgefill_version"):
        raise RidgefillError(
            f"the llama_cpp package at {Path(bindings.__file__).parent} is not the RidgeFill fork "
            "(its libllama has no llama_ridgefill_version); reinstall RidgeFill with `pip install .` "
            "from the RidgeFill checkout")
    for name in ("llama_ridgefill_version", "llama_ridgefill_upstream",
                 "llama_ridgefill_patch_series", "llama_ridgefill_fork_info", "llama_ridgefill_last_error"):
        fn = getattr(handle, name)
        fn.argtypes = []
        fn.restype = ctypes.c_char_p
    ctx, i32, i64p = ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)
    f32p = ctypes.POINTER(ctypes.c_float)
    for name, args, res in (
            ("llama_ridgefill_capture_layer_input", [ctx, i32, ctypes.c_bool], ctypes.c_bool),
            ("llama_ridgefill_layer_input", [ctx, i32], ctypes.POINTER(ctypes.c_float)),
            ("llama_ridgefill_load_maps", [ctx, ctypes.c_char_p, ctypes.c_char_p], i32),
            ("llama_ridgefill_set_enabled", [ctx, ctypes.c_bool], i32),
            ("llama_ridgefill_set_sink_tokens", [ctx, i32], i32),
            ("llama_ridgefill_sink_tokens", [ctx], i32),
            ("llama_ridgefill_maps_sink_tokens", [ctx], i32),
            ("llama_ridgefill_reusable_prefix", [i32, ctypes.POINTER(i32), i32, i32, i32], i32),
            ("llama_ridgefill_set_exact_from", [ctx, i32, i32], i32),
            ("llama_ridgefill_set_splice", [ctx, ctypes.c_char_p], i32),
            ("llama_ridgefill_split_layer", [ctx], i32),
            ("llama_ridgefill_set_band", [ctx, i32, i32], i32),
            ("llama_ridgefill_set_band_cost_warning", [ctx, ctypes.c_bool], None),
            ("llama_ridgefill_band", [ctx, ctypes.POINTER(i32), ctypes.POINTER(i32)], i32),
            ("llama_ridgefill_set_band_full_layers", [ctx, ctypes.POINTER(i32), i32], i32),
            ("llama_ridgefill_band_full_layers", [ctx, ctypes.POINTER(i32), i32], i32),
            ("llama_ridgefill_map_kind", [ctx], ctypes.c_char_p),
            ("llama_ridgefill_context_tokens", [ctx], i32),
            ("llama_ridgefill_capture_predicted", [ctx, ctypes.c_bool], i32),
            ("llama_ridgefill_predicted", [ctx, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)],
             ctypes.POINTER(ctypes.c_float)),
            ("llama_ridgefill_maps_size", [ctx], ctypes.c_int64),
            ("llama_ridgefill_get_counts", [ctx, i32, i64p, i64p], None),
            ("llama_ridgefill_reset_counts", [ctx, i32], None),
            ("llama_ridgefill_set_guard", [ctx, i32, ctypes.c_bool], i32),
            ("llama_ridgefill_set_guard_period", [ctx, i32], i32),
            ("llama_ridgefill_guard", [ctx, i32, f32p, f32p, f32p, ctypes.POINTER(i32), ctypes.POINTER(i32)], i32),
            ("llama_ridgefill_take_filled", [ctx, i32, ctypes.POINTER(i32), i32], i32),
            ("llama_ridgefill_placement", [ctx, i32, ctypes.c_bool], ctypes.c_char_p),
            ("llama_ridgefill_add_rpc_servers", [ctypes.c_char_p], i32)):
        fn = getattr(handle, name)
        fn.argtypes, fn.restype = args, res
    return handle


def reusable_prefix(n_common: int, filled: list[tuple[int, int]], plan: tuple[int, int] | None) -> int:
    """How many of n_common cached tokens whose cells `filled` were filled approximately a request that will
    fill `plan` (None: exact) may reuse: the rule of llama_ridgefill_reusable_prefix (cpp/ridgefill.h)."""
    flat = (ctypes.c_int32 * (2 * len(filled) or 1))(*[p for r in filled for p in r])
    b, e = plan or (0, 0)
    return lib().llama_ridgefill_reusable_prefix(n_common, flat, len(filled), b, e)


def check(rc: int) -> None:
    """Raise the runtime's last error if a llama_ridgefill_* call failed."""
    if rc != 0:
        raise RidgefillError(lib().llama_ridgefill_last_error().decode())


def library_path() -> Path:
    return Path(lib()._name)


def fork_identity() -> dict[str, str]:
    """The identity compiled into the loaded libllama."""
    h = lib()
    return {
        "version": h.llama_ridgefill_version().decode(),
        "upstream": h.llama_ridgefill_upstream().decode(),
        "patch_series": h.llama_ridgefill_patch_series().decode(),
        "library": str(library_path()),
    }
