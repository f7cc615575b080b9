"""RidgeFill prefill from Python: `ridgefill.Llama`, a llama_cpp.Llama that fills the cache from maps.

    llm = ridgefill.Llama("model.ridgefill.gguf", tail_tokens=1024, n_ctx=8192)
    llm.create_completion(long_prompt, max_tokens=64)      # as with llama_cpp.Llama
    llm.ridgefill_counts()                                 # (tokens filled approximately, computed exactly)

For each new prompt the tail (its last `tail_tokens` tokens) and the first `sink_tokens` positions run
exactly; the tokens between take the approximate path.  Decode steps are always exact.  A prompt no
longer than sink_tokens + tail_tokens is all exact.  The maps come from the model file itself (an
augmented GGUF from `ridgefill export`) or from `maps_path` (a map file from `ridgefill calibrate`).

A prompt that shares a prefix with the cached one reuses it as llama_cpp.Llama does, under the
server's rule (cpp/ridgefill.h: llama_ridgefill_reusable_prefix): an exact prompt reuses only the
cells before the first approximately filled one, an approximate prompt every cell filled as it would
fill it or with more exact work, so the next turn of a chat keeps its cache.  With logits_all=True
the rows with logits are exact and the filled rows have none: their `scores` are NaN.

Several machines: `rpc_servers="host:port,..."` with `n_gpu_layers=N` puts the last N layers (and
their maps) on llama.cpp RPC servers (`ridgefill-rpc-server`; see ridgefill.rpc).

The out-of-distribution guard (`guard=True`, the default, for maps that carry its threshold) computes the first
rows each prompt would fill exactly and compares the maps' predictions with them there (and every
`guard_period` positions); a prompt the maps do not fit is computed exactly.  `guard_result()` says what it
decided for the last prompt.

A windowed band (`band_layers`, `band_window`; default: the maps' own, see `ridgefill calibrate --band-layers`):
on the filled rows the band_layers layers below the split layer run in full, attending only to the sink and
their band_window latest positions, and the maps read their output (docs/maps.md, "A windowed band").

For the eval harness: `prompt_logits(tokens, logits_from)` returns the logits of the prompt's tail
rows, and `splice="k"|"v"|"kv"|"kscale"` (debug) keeps exact keys, values, both, or the exact key
scale in the filled cells (see cpp/ridgefill.h: llama_ridgefill_set_splice).
"""
from __future__ import annotations

import ctypes
import warnings
from typing import Callable, Sequence

import llama_cpp
import numpy as np

from ._lib import check, lib, reusable_prefix
from .errors import RidgefillError
from .modelfile import check_gguf

SEQ = 0  # llama_cpp.Llama runs one sequence


class Llama(llama_cpp.Llama):
    def __init__(self, model_path: str, *, ridgefill: bool = True, maps_path: str | None = None,
                 tail_tokens: int = 1024, sink_tokens: int | None = None, splice: str | None = None,
                 rpc_servers: str | None = None, guard: bool = True, guard_period: int | None = None,
                 band_layers: int | None = None, band_window: int | None = None,
                 band_full_layers: Sequence[int] | None = None, **kwargs):
        check_gguf(model_path)
        if maps_path is not None:
            check_gguf(maps_path)
        if tail_tokens < 1:
            raise RidgefillError(f"tail_tokens must be >= 1, not {tail_tokens}")
        if sink_tokens is not None and sink_tokens < 0:
            raise RidgefillError(f"sink_tokens must be >= 0, not {sink_tokens}")
        self._filled: list[tuple[int, int]] = []  # fill record: cached positions filled approximately
        if rpc_servers:
            from .rpc import add_servers
            add_servers(rpc_servers)  # layers offloaded with n_gpu_layers (and their maps) then run there
        super().__init__(model_path=model_path, **kwargs)
        self.tail_tokens = tail_tokens
        self.maps_path = str(maps_path or model_path)
        h = lib()
        h.llama_ridgefill_set_band_cost_warning(self.ctx, False)  # said below as a RuntimeWarning, which can be filtered
        check(h.llama_ridgefill_load_maps(self.ctx, self.maps_path.encode(),
                                          str(model_path).encode() if maps_path else None))
        check(h.llama_ridgefill_set_sink_tokens(self.ctx, -1 if sink_tokens is None else sink_tokens))
        self.sink_tokens = h.llama_ridgefill_sink_tokens(self.ctx)  # None: the maps' calibrated sink
        self.set_band(band_layers, band_window, band_full_layers)
        self.set_splice(splice)
        self.set_ridgefill(ridgefill)
        self.set_guard(guard, guard_period)

    def load_maps(self, maps_path: str) -> None:
        """Fill from other maps of the same model from now on; the cache is dropped (the old maps filled it)."""
        check_gguf(maps_path)
        check(lib().llama_ridgefill_load_maps(self.ctx, str(maps_path).encode(), str(self.model_path).encode()))
        self.maps_path = str(maps_path)
        self.sink_tokens = lib().llama_ridgefill_sink_tokens(self.ctx)
        self.reset()
        self._warn_band_cost()

    def __del__(self):
        if hasattr(self, "_stack"):  # not when __init__ refused its arguments before the model was loaded
            super().__del__()

    @property
    def split_layer(self) -> int:
        return lib().llama_ridgefill_split_layer(self.ctx)

    @property
    def band(self) -> tuple[int, int]:
        """(band_layers, band_window) in effect; (0, 0): no band."""
        layers, window = ctypes.c_int32(), ctypes.c_int32()
        lib().llama_ridgefill_band(self.ctx, ctypes.byref(layers), ctypes.byref(window))
        return layers.value, window.value

    @property
    def band_full_layers(self) -> tuple[int, ...]:
        """The band's layers in effect that attend to every position (unwindowed), ascending."""
        n = lib().llama_ridgefill_band_full_layers(self.ctx, None, 0)
        out = (ctypes.c_int32 * max(n, 0))()
        lib().llama_ridgefill_band_full_layers(self.ctx, out, n)
        return tuple(out)

    def set_band(self, band_layers: int | None = None, band_window: int | None = None,
                 band_full_layers: Sequence[int] | None = None) -> None:
        """The windowed band for the next prompts (None: the maps' own value; band_layers 0: no band;
        band_full_layers: band layers that attend to every position, () none).  Cells the old setting filled would
        not be what this one fills: the cache is dropped."""
        for name, v in (("band_layers", band_layers), ("band_window", band_window)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise RidgefillError(f"{name} must be an integer >= 0 (or None: the maps' own), not {v!r}")
        if band_full_layers is not None and not all(isinstance(x, int) for x in band_full_layers):
            raise RidgefillError(f"band_full_layers must be layer numbers (or None: the maps' own), not "
                                 f"{band_full_layers!r}")
        before = (self.band, self.band_full_layers) if hasattr(self, "_band_set") else None
        check(lib().llama_ridgefill_set_band(self.ctx, -1 if band_layers is None else band_layers,
                                             -1 if band_window is None else band_window))
        full = None if band_full_layers is None else list(band_full_layers)
        check(lib().llama_ridgefill_set_band_full_layers(
            self.ctx, (ctypes.c_int32 * len(full))(*full) if full else None, -1 if full is None else len(full)))
        self._band_set = True
        if before is not None and before != (self.band, self.band_full_layers):
            self.reset()
        self._warn_band_cost()

    def _warn_band_cost(self) -> None:
        if self.band[0] and self.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED:
            warnings.warn(f"a band of {self.band[0]} layers with flash_attn=False saves nothing over split layer "
                          f"{self.split_layer} alone: the window masks the band layers' attention, only flash "
                          "attention skips what it masks (pass flash_attn=True)", RuntimeWarning, stacklevel=3)

    @property
    def map_kind(self) -> str:
        """What the maps predict: "input" (a late layer's input) or "kv" (its K and V)."""
        return lib().llama_ridgefill_map_kind(self.ctx).decode()

    @property
    def context_tokens(self) -> int:
        """How many predecessors' split-layer states the maps read besides the token's own."""
        return lib().llama_ridgefill_context_tokens(self.ctx)

    def capture_predicted(self, enable: bool = True) -> None:
        """Debug: keep the map outputs of each decode's approximate tokens (see predicted())."""
        check(lib().llama_ridgefill_capture_predicted(self.ctx, bool(enable)))

    def predicted(self, layer: int) -> np.ndarray:
        """The map outputs y = W f + b of the last decode's approximate tokens for late layer `layer`, in batch
        order: (n, d) predicted inputs, or (n, d_k + d_v) [K; V] rows for kv maps (K before RoPE)."""
        rows, cols = ctypes.c_int32(), ctypes.c_int32()
        ptr = lib().llama_ridgefill_predicted(self.ctx, layer, ctypes.byref(rows), ctypes.byref(cols))
        if not ptr:
            return np.zeros((0, cols.value), dtype=np.float32)
        return np.ctypeslib.as_array(ptr, shape=(rows.value, cols.value)).copy()

    @property
    def maps_bytes(self) -> int:
        return lib().llama_ridgefill_maps_size(self.ctx)

    def placement(self, layer: int, map: bool = False) -> str | None:
        """The device holding `layer`'s weights (map=True: its RidgeFill map), e.g. "CPU" or "RPC0"."""
        name = lib().llama_ridgefill_placement(self.ctx, layer, map)
        return name.decode() if name else None

    @property
    def filled_ranges(self) -> list[tuple[int, int]]:
        """The fill record: ranges [begin, end) of cached positions filled approximately."""
        return list(self._filled)

    def set_ridgefill(self, enabled: bool, tail_tokens: int | None = None) -> None:
        """Turn approximate prefill on or off for the next prompts (cached cells are reused only as the rule allows)."""
        check(lib().llama_ridgefill_set_enabled(self.ctx, bool(enabled)))
        self.ridgefill = bool(enabled)
        if tail_tokens is not None:
            if tail_tokens < 1:
                raise RidgefillError(f"tail_tokens must be >= 1, not {tail_tokens}")
            self.tail_tokens = tail_tokens

    def set_guard(self, enabled: bool, period: int | None = None) -> None:
        """The out-of-distribution guard on or off for the next prompts; period: positions between checks after
        the probe (0: the probe only; None: unchanged, the runtime's default 1024)."""
        check(lib().llama_ridgefill_set_guard(self.ctx, -1, bool(enabled)))
        if period is not None:
            check(lib().llama_ridgefill_set_guard_period(self.ctx, int(period)))
        self.guard = bool(enabled)

    def guard_result(self) -> dict:
        """The guard's verdict on the last prompt: {"guard": "off" | "unchecked" | "passed" | "fell_back",
        "score" (after the last check: ridgefill.guard.pooled), "max_score" (the largest after any check),
        "threshold", "checks", "fell_back_at" (a position, or None)}."""
        score, top, thr = ctypes.c_float(), ctypes.c_float(), ctypes.c_float()
        n, at = ctypes.c_int32(), ctypes.c_int32()
        v = lib().llama_ridgefill_guard(self.ctx, SEQ, ctypes.byref(score), ctypes.byref(top), ctypes.byref(thr),
                                        ctypes.byref(n), ctypes.byref(at))
        return {"guard": {-1: "off", 0: "unchecked", 1: "passed", 2: "fell_back"}[v], "score": score.value,
                "max_score": top.value, "threshold": thr.value, "checks": n.value,
                "fell_back_at": at.value if at.value >= 0 else None}

    def set_splice(self, mode: str | None) -> None:
        """Debug: None/"none", or keep exact "k", "v", "kv" or the exact key scale ("kscale") in filled cells."""
        check(lib().llama_ridgefill_set_splice(self.ctx, (mode or "none").encode()))
        self.splice = mode if mode not in (None, "none") else None
        self.reset()  # cells filled in another splice mode are not what the record says

    def reset(self) -> None:
        super().reset()
        self._filled = []

    def ridgefill_counts(self) -> tuple[int, int]:
        """(prompt and decode tokens filled approximately, computed exactly) since the last new prompt."""
        a, e = ctypes.c_int64(), ctypes.c_int64()
        lib().llama_ridgefill_get_counts(self.ctx, SEQ, ctypes.byref(a), ctypes.byref(e))
        return a.value, e.value

    def _plan(self, n_prompt: int) -> tuple[int, int] | None:
        """The positions a prompt of n_prompt tokens fills approximately, or None (all exact)."""
        end = n_prompt - self.tail_tokens
        return (self.sink_tokens, end) if self.ridgefill and end > self.sink_tokens else None

    def generate(self, tokens: Sequence[int], *args, **kwargs):
        # Reuse of the cached prefix is decided here, by the rule; llama_cpp.Llama then finds nothing more to drop.
        tokens = list(tokens)
        if kwargs.get("reset", True) and self.n_tokens > 0:
            common = 0
            for a, b in zip(self.input_ids[:self.n_tokens], tokens):
                if a != b:
                    break
                common += 1
            keep = reusable_prefix(common, self._filled, self._plan(len(tokens)))
            if not (keep == len(tokens) == self.n_tokens and not self._requires_eval):
                self._keep_first(min(keep, len(tokens) - 1))  # at least one token is evaluated for the logits
        lib().llama_ridgefill_reset_counts(self.ctx, SEQ)
        return super().generate(tokens, *args, **kwargs)

    def _keep_first(self, n: int) -> None:
        """Drop the cached cells from position n on (all of them if the cache cannot keep n)."""
        if n >= self.n_tokens:
            return
        mem = llama_cpp.llama_get_memory(self.ctx)
        n_swa = llama_cpp.llama_model_n_swa(self.model)
        # a sliding-window cache no longer holds the window before position n once it has moved past it
        window_lost = n_swa > 0 and llama_cpp.llama_memory_seq_pos_min(mem, SEQ) > max(0, n - n_swa)
        if n <= 0 or window_lost or not self._ctx.kv_cache_seq_rm(-1, n, -1):
            self.reset()
            return
        self.n_tokens = n
        self._filled = [(b, min(e, n)) for b, e in self._filled if b < n]
        self._requires_eval = True

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens as the continuation of the cached ones: the last tail_tokens of them are exact."""
        n_prompt = self.n_tokens + len(tokens)
        plan = self._plan(n_prompt)
        exact_from = plan[1] if plan else -1
        last = n_prompt - 1
        # logits_all: every row that is computed exactly gets logits; filled rows have none
        self._decode(tokens, exact_from, lambda pos: pos == last or (self._logits_all and not
                                                                    self.sink_tokens <= pos < exact_from))

    def prompt_logits(self, tokens: Sequence[int], logits_from: int) -> np.ndarray:
        """Prefill `tokens` as a new prompt; the logits of positions >= logits_from, float32 [n, n_vocab].

        Rows with logits are exact by definition, so keep logits_from inside the tail.
        """
        if not 0 <= logits_from < len(tokens):
            raise RidgefillError(f"logits_from must be in [0, {len(tokens)}), not {logits_from}")
        self.reset()
        plan = self._plan(len(tokens))
        rows = []
        self._decode(tokens, plan[1] if plan else -1, lambda pos: pos >= logits_from, rows.append)
        return np.concatenate(rows)

    def save_state(self) -> llama_cpp.LlamaState:
        state = super().save_state()
        state.ridgefill_filled = list(self._filled)  # the fill record travels with the cells
        return state

    def load_state(self, state: llama_cpp.LlamaState) -> None:
        super().load_state(state)
        self._filled = list(getattr(state, "ridgefill_filled", []))  # a stock Llama's state is all exact

    def _decode(self, tokens: Sequence[int], exact_from: int, wants_logits: Callable[[int], bool],
                on_logits=None) -> None:
        h = lib()
        check(h.llama_ridgefill_set_exact_from(self.ctx, SEQ, exact_from if self.ridgefill else -1))
        if self.n_tokens == 0:
            h.llama_ridgefill_reset_counts(self.ctx, SEQ)  # counts are per prompt
            self._take_filled()
            self._filled = []
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        self._filled = [(b, min(e, self.n_tokens)) for b, e in self._filled if b < self.n_tokens]
        for start in range(0, len(tokens), self.n_batch):
            chunk = list(tokens[start:start + self.n_batch])
            n_past = self.n_tokens
            self._batch.set_batch(batch=chunk, n_past=n_past, logits_all=False)
            flags = [wants_logits(n_past + i) for i in range(len(chunk))]
            for i, f in enumerate(flags):
                self._batch.batch.logits[i] = f
            self._ctx.decode(self._batch)
            if any(flags):
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.ctx), shape=(sum(flags), self.n_vocab()))
                if on_logits is not None:
                    on_logits(logits.copy())
                if self._logits_all:
                    rows = self.scores[n_past:n_past + len(chunk)]
                    rows[:] = np.nan
                    rows[np.flatnonzero(flags)] = logits
            elif self._logits_all:
                self.scores[n_past:n_past + len(chunk)] = np.nan
            self._take_filled()
            self.input_ids[n_past:n_past + len(chunk)] = chunk
            self.n_tokens += len(chunk)
        self._requires_eval = False

    def _take_filled(self) -> list[tuple[int, int]]:
        """Add what the runtime filled since the last call (it decides each token's path) to the fill record."""
        buf = (ctypes.c_int32 * 128)()
        n = lib().llama_ridgefill_take_filled(self.ctx, SEQ, buf, 64)
        if n < 0:
            raise RidgefillError(lib().llama_ridgefill_last_error().decode())
        for b, e in zip(buf[0:2 * n:2], buf[1:2 * n:2]):
            if self._filled and self._filled[-1][1] >= b:
                self._filled[-1] = (self._filled[-1][0], max(self._filled[-1][1], e))
            else:
                self._filled.append((b, e))
        return self._filled
