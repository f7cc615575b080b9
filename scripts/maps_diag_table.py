#!/usr/bin/env python3
"""A Markdown table of calibration diagnostics (held-out K/V relative error) for several map files (docs/maps.md).

    python scripts/maps_diag_table.py build/maps/smollm2-s15-*.gguf
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.ggufio import read_maps  # noqa: E402


def main() -> None:
    paths = sys.argv[1:]
    first = read_maps(paths[0])
    show = first.late_layers[:3]
    print("| maps | kind | C | file MiB | " + " | ".join(f"K err l{l}" for l in show) +
          " | K err mean | V err mean | K err id mean |")
    print("|---|---|---|---|" + "---|" * (len(show) + 3))
    for p in paths:
        m = read_maps(p)
        d = m.diagnostics
        k, v = np.asarray(d["k_rel_err"]), np.asarray(d["v_rel_err"])
        cells = [f"{k[m.late_layers.index(l)]:.3f}" for l in show]
        print(f"| {Path(p).stem} | {m.map_kind} | {m.context_tokens} | {Path(p).stat().st_size / 2**20:.1f} | "
              + " | ".join(cells) + f" | {k.mean():.3f} | {v.mean():.3f} | {np.mean(d['identity_k_rel_err']):.3f} |")


if __name__ == "__main__":
    main()
