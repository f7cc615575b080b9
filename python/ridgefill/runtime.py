"""RidgeFill prefill from Python: `ridgefill.Llama`, a llama_cpp.Llama that fills the cache from maps.

    llm = ridgefill.Llama("model.ridgefill.gguf", tail_tokens=1024, n_ctx=8192)
    llm.create_completion(long_prompt, max_tokens=64)      # as with llama_cpp.Llama
    llm.ridgefill_counts()                                 # (tokens filled approximately, computed exactly)

For each new prompt the tail (its last `tail_tokens` tokens) and the first `sink_tokens` positions run
exactly; the tokens between take the approximate path.  Decode steps are always exact.  A prompt no
longer than sink_tokens + tail_tokens is all exact.  The maps come from the model file itself (an
augmented GGUF from `ridgefill export`) or from `maps_path` (a map file from `ridgefill calibrate`).

For the eval harness: `prompt_logits(tokens, logits_from)` returns the logits of the prompt's tail
rows, and `splice="k"|"v"|"kv"|"kscale"` (debug) keeps exact keys, values, both, or the exact key
scale in the filled cells (see cpp/ridgefill.h: llama_ridgefill_set_splice).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Sequence

import llama_cpp
import numpy as np

from ._lib import check, lib
from .errors import RidgefillError
from .modelfile import check_gguf

SEQ = 0  # llama_cpp.Llama runs one sequence


class Llama(llama_cpp.Llama):
    def __init__(self, model_path: str, *, ridgefill: bool = True, maps_path: str | None = None,
                 tail_tokens: int = 1024, sink_tokens: int = 4, splice: str | None = None, **kwargs):
        check_gguf(model_path)
        if maps_path is not None:
            check_gguf(maps_path)
        if tail_tokens < 1:
            raise RidgefillError(f"tail_tokens must be >= 1, not {tail_tokens}")
        if sink_tokens < 0:
            raise RidgefillError(f"sink_tokens must be >= 0, not {sink_tokens}")
        super().__init__(model_path=model_path, **kwargs)
        self.tail_tokens, self.sink_tokens = tail_tokens, sink_tokens
        self.maps_path = str(maps_path or model_path)
        h = lib()
        check(h.llama_ridgefill_load_maps(self.ctx, self.maps_path.encode(),
                                          str(model_path).encode() if maps_path else None))
        check(h.llama_ridgefill_set_sink_tokens(self.ctx, sink_tokens))
        self.set_splice(splice)
        self.set_ridgefill(ridgefill)

    def __del__(self):
        if hasattr(self, "_stack"):  # not when __init__ refused its arguments before the model was loaded
            super().__del__()

    @property
    def split_layer(self) -> int:
        return lib().llama_ridgefill_split_layer(self.ctx)

    @property
    def maps_bytes(self) -> int:
        return lib().llama_ridgefill_maps_size(self.ctx)

    def set_ridgefill(self, enabled: bool, tail_tokens: int | None = None) -> None:
        """Turn approximate prefill on or off for the next prompts (the cache is dropped: it may hold filled rows)."""
        check(lib().llama_ridgefill_set_enabled(self.ctx, bool(enabled)))
        self.ridgefill = bool(enabled)
        if tail_tokens is not None:
            if tail_tokens < 1:
                raise RidgefillError(f"tail_tokens must be >= 1, not {tail_tokens}")
            self.tail_tokens = tail_tokens
        self.reset()

    def set_splice(self, mode: str | None) -> None:
        """Debug: None/"none", or keep exact "k", "v", "kv" or the exact key scale ("kscale") in filled cells."""
        check(lib().llama_ridgefill_set_splice(self.ctx, (mode or "none").encode()))
        self.splice = mode if mode not in (None, "none") else None
        self.reset()

    def ridgefill_counts(self) -> tuple[int, int]:
        """(prompt and decode tokens filled approximately, computed exactly) since the last new prompt."""
        a, e = ctypes.c_int64(), ctypes.c_int64()
        lib().llama_ridgefill_get_counts(self.ctx, SEQ, ctypes.byref(a), ctypes.byref(e))
        return a.value, e.value

    def generate(self, tokens: Sequence[int], *args, **kwargs):
        # A cached prefix may hold approximately filled rows computed for another prompt's tail, so
        # every new prompt is evaluated from scratch when RidgeFill is on (no prefix reuse).
        if self.ridgefill:
            self.reset()
        return super().generate(tokens, *args, **kwargs)

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens; a new prompt (empty cache) first declares where its exact tail starts."""
        last = self.n_tokens + len(tokens) - 1
        self._decode(tokens, lambda pos: self._logits_all or pos == last)

    def prompt_logits(self, tokens: Sequence[int], logits_from: int) -> np.ndarray:
        """Prefill `tokens` as a new prompt; the logits of positions >= logits_from, float32 [n, n_vocab].

        Rows with logits are exact by definition, so keep logits_from inside the tail.
        """
        if not 0 <= logits_from < len(tokens):
            raise RidgefillError(f"logits_from must be in [0, {len(tokens)}), not {logits_from}")
        self.reset()
        rows = []
        self._decode(tokens, lambda pos: pos >= logits_from, rows.append)
        return np.concatenate(rows)

    def _decode(self, tokens: Sequence[int], wants_logits: Callable[[int], bool], on_logits=None) -> None:
        h = lib()
        if self.n_tokens == 0:
            exact_from = len(tokens) - self.tail_tokens
            check(h.llama_ridgefill_set_exact_from(self.ctx, SEQ, exact_from if exact_from > self.sink_tokens else -1))
            h.llama_ridgefill_reset_counts(self.ctx, SEQ)
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for start in range(0, len(tokens), self.n_batch):
            chunk = list(tokens[start:start + self.n_batch])
            self._batch.set_batch(batch=chunk, n_past=self.n_tokens, logits_all=False)
            flags = [wants_logits(self.n_tokens + i) for i in range(len(chunk))]
            for i, f in enumerate(flags):
                self._batch.batch.logits[i] = f
            self._ctx.decode(self._batch)
            if on_logits is not None and any(flags):
                ptr = llama_cpp.llama_get_logits(self.ctx)
                on_logits(np.ctypeslib.as_array(ptr, shape=(sum(flags), self.n_vocab())).copy())
            self.input_ids[self.n_tokens:self.n_tokens + len(chunk)] = chunk
            self.n_tokens += len(chunk)
        self._requires_eval = False
