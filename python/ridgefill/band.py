"""Which band layers attend to every position: chosen by the tail KL on calibration text.

`ridgefill calibrate --band-layers B --band-window W --band-full-layers auto[:N]` (and scripts/band_select.py).
The window takes the far context from every band layer; a few layers need it far more than the rest (docs/maps.md,
"Which band layers need the far context").  Which ones cannot be read off the hidden states — how far the window
moves them ranks the layers unlike the tail's KL (scripts/band_hidden_error.py) — so this measures the KL itself:
per chunk of the text the maps were fitted on (read as `calibrate` read it; never the held-out prompts `ridgefill
eval` draws), exact prefill, then the fill with the split layer alone, with the fully windowed band, and with each
group of `group` consecutive band layers unwindowed, each scored by KL(exact || fill) over the last `tail_tokens`
positions.  The group with the lowest mean KL is chosen first; then, until N layers are chosen, each remaining
group is measured together with those chosen and the lowest joins them (groups overlap in what they restore: on
SmolLM2, 16, 17 closes a fifth of the window's gap alone and little beside 14, 15; docs/maps.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from .errors import RidgefillError
from .evaluate import _log_softmax


@dataclass
class BandChoice:
    split_layer: int
    band_layers: int
    band_window: int
    length: int
    tail_tokens: int
    chosen: tuple[int, ...]
    kl: dict[str, list[float]] = field(default_factory=dict)   # setting -> KL per chunk
    steps: list[list[str]] = field(default_factory=list)      # the greedy steps' candidates (names in kl)

    def mean(self, name: str) -> float:
        return float(np.mean(self.kl[name]))

    def unresolved(self) -> list[tuple[str, str]]:
        """(winner, another candidate) of a greedy step whose order not every prompt agrees on: the measurement
        does not tell them apart (on SmolLM2's four 8K calibration prompts: pairs 10, 11 and 16, 17 measured
        alone; docs/maps.md)."""
        out = []
        for step in self.steps:
            best = min(step, key=self.mean)
            out += [(best, b) for b in step if b != best and not all(x < y for x, y in zip(self.kl[best], self.kl[b]))]
        return out

    def table(self) -> str:
        base, win = self.mean("split alone"), self.mean("windowed")
        rows = ["| unwindowed band layers | tail KL, calibration text | / split alone | "
                "share of the window's gap closed |", "|---|---|---|---|"]
        for name in self.kl:
            closed = f"{100 * (win - self.mean(name)) / (win - base):.0f}%" if win > base else "—"
            label = (f"**chosen: {', '.join(map(str, self.chosen)) or 'none'}**" if name == "chosen"
                     else name.replace("+", " + "))
            rows.append(f"| {label} | {self.mean(name):.5f} | {self.mean(name) / base:.3f} | {closed} |")
        return "\n".join(rows)


def calibration_chunks(llm, maps_path: str, length: int, count: int) -> list[list[int]]:
    """Up to `count` prompts of `length` tokens (BOS + text) from what calibration read for these maps, from its
    start; shorter prompts (one) when calibration read fewer than `length` tokens: never text beyond it, which
    `ridgefill eval` treats as held out."""
    from . import data
    from .calibrate import read_documents
    from .evaluate import calibration_reading
    reading = calibration_reading(maps_path)
    if reading is None:
        raise RidgefillError(f"{maps_path}: not calibrated on a corpus (--text files are not recorded), so there is "
                             "no calibration text to choose band layers on")
    corpus, read, order = reading
    bos = [llm.token_bos()] if llm.token_bos() >= 0 else []
    length = min(length, read)
    per = length - len(bos)
    n = max(1, min(count, read // length))
    ids, _ = read_documents([d.text for d in data.corpus(corpus)],
                            lambda t: llm.tokenize(t.encode(), add_bos=False, special=False), n * per, order)
    n = min(n, len(ids) // per)
    if n == 0:
        raise RidgefillError(f"corpus {corpus}: fewer than {per} tokens to choose band layers on")
    return [bos + ids[i * per:(i + 1) * per] for i in range(n)]


def full_count(band_layers: int, n_full: int | None, group: int = 2) -> int:
    """How many layers the choice leaves unwindowed (default: two fifths of the band, in whole groups); refuses what
    cannot be chosen before anything runs."""
    if band_layers < 1:
        raise RidgefillError("choosing unwindowed band layers needs a band (--band-layers B > 0)")
    if group < 1:
        raise RidgefillError(f"group must be >= 1, not {group}")
    if n_full is None:
        n_full = group * max(1, round(2 * band_layers / 5 / group))
    if not 0 < n_full < band_layers:
        raise RidgefillError(f"auto:{n_full}: the number of unwindowed band layers must be within 1..{band_layers - 1}")
    if n_full % group:
        raise RidgefillError(f"auto:{n_full}: layers are chosen {group} at a time; give a multiple of {group}")
    return n_full


def choose_full_layers(model: str, maps: str, band_layers: int, band_window: int, n_full: int | None = None, *,
                       group: int = 2, length: int = 8192, tail_tokens: int = 1024, chunks: int = 4,
                       threads: int | None = None, progress: bool = True) -> BandChoice:
    """Measure and choose; `n_full` layers (default: two fifths of the band, in whole groups) left unwindowed."""
    from .runtime import Llama
    n_full = full_count(band_layers, n_full, group)
    threads = threads or os.cpu_count() or 1
    llm = Llama(str(model), maps_path=str(maps), tail_tokens=tail_tokens, n_ctx=length, n_batch=length,
                n_ubatch=512, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False,
                guard=False, band_layers=0, band_window=band_window, band_full_layers=())
    prompts = calibration_chunks(llm, str(maps), min(length, llm._model.n_ctx_train()), chunks)
    length = len(prompts[0])
    if not band_window + tail_tokens < length:
        raise RidgefillError(f"band window {band_window} + tail {tail_tokens} must be shorter than the {length}-token "
                             "prompts the choice measures on: the window would cover every filled row")
    s = llm.split_layer
    band = list(range(s - band_layers, s))
    groups = [tuple(band[i:i + group]) for i in range(0, band_layers, group)]
    settings = {"split alone": (0, band_window, ()), "windowed": (band_layers, band_window, ()),
                **{",".join(map(str, g)): (band_layers, band_window, g) for g in groups}}
    start = length - tail_tokens
    out = BandChoice(s, band_layers, band_window, length, tail_tokens, (), {n: [] for n in settings})
    bar = tqdm(total=len(prompts) * (len(settings) + 1), unit="prefill", desc="band layers", disable=not progress)

    def kl(exact: np.ndarray, toks: list[int], setting) -> float:
        llm.set_band(*setting)
        llm.set_ridgefill(True)
        lq = _log_softmax(llm.prompt_logits(toks, start))
        bar.update()
        return float((np.exp(exact) * (exact - lq)).sum(-1).mean())

    exacts = []
    for toks in prompts:
        llm.set_ridgefill(False)
        exacts.append(_log_softmax(llm.prompt_logits(toks, start)))
        bar.update()
        for name, setting in settings.items():
            out.kl[name].append(kl(exacts[-1], toks, setting))
    # greedy: the best pair alone, then each further pair measured together with those already chosen (pairs
    # overlap: a second pair may add little to the first that it gives alone)
    layers = {",".join(map(str, g)): g for g in groups}       # candidate name -> its unwindowed layers
    out.steps.append(list(layers))
    best = min(layers, key=out.mean)
    while len(layers[best]) + group <= n_full:
        rest = [g for g in groups if not set(g) & set(layers[best])]
        bar.total += len(rest) * len(prompts)
        bar.refresh()
        step = {f"{best}+{','.join(map(str, g))}": tuple(sorted(layers[best] + g)) for g in rest}
        for name, full in step.items():
            out.kl[name] = [kl(e, toks, (band_layers, band_window, full)) for e, toks in zip(exacts, prompts)]
        layers.update(step)
        out.steps.append(list(step))
        best = min(step, key=out.mean)
    out.chosen = layers[best]
    out.kl["chosen"] = list(out.kl[best])
    bar.close()
    return out


def choose_and_record(model: str, maps: str, band_layers: int, band_window: int, n_full: int | None = None,
                      **kw) -> BandChoice:
    """What `calibrate --band-full-layers auto[:N]` does after fitting: choose, then record the band and the chosen
    layers in the map file as its defaults (the runtime, server and eval read them from there)."""
    import dataclasses

    from .ggufio import read_maps, write_maps
    choice = choose_full_layers(model, maps, band_layers, band_window, n_full, **kw)
    m = read_maps(maps)
    write_maps(maps, dataclasses.replace(m, band_layers=band_layers, band_window=band_window,
                                         band_full_layers=choice.chosen))
    return choice
