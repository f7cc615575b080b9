"""Which band layers to leave unwindowed, chosen by the tail KL on calibration text (ridgefill.band; docs/maps.md).

    python scripts/band_select.py MODEL.gguf MAPS.gguf --band-layers 10 --band-window 1024
        [--n-full 4 --group 2 --length 8192 --tail-tokens 1024 --chunks 4] --json OUT.json

What `ridgefill calibrate --band-full-layers auto[:N]` runs after fitting, on maps already calibrated: prints the
table and keeps every chunk's KL in the JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.band import choose_full_layers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("maps", type=Path)
    ap.add_argument("--band-layers", type=int, required=True)
    ap.add_argument("--band-window", type=int, required=True)
    ap.add_argument("--n-full", type=int, default=None, help="layers left unwindowed (default: two fifths of the band)")
    ap.add_argument("--group", type=int, default=2, help="consecutive band layers unwindowed together")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--tail-tokens", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    c = choose_full_layers(str(a.model), str(a.maps), a.band_layers, a.band_window, a.n_full, group=a.group,
                           length=a.length, tail_tokens=a.tail_tokens, chunks=a.chunks, threads=a.threads)
    print(c.table())
    for won, other in c.unresolved():
        print(f"not told apart: {won} (chosen) and {other} (left out) — not every prompt puts {won} lower")
    a.json.write_text(json.dumps({"model": a.model.name, "maps": a.maps.name, "group": a.group,
                                  **dataclasses.asdict(c)}, indent=1))


if __name__ == "__main__":
    main()
