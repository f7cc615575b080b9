#!/usr/bin/env python3
"""Render docs/data/bench-*.json (from scripts/bench_report.sh) as the tables of docs/results-ttft.md."""
import json
from pathlib import Path

from ridgefill.bench import markdown

for path in sorted(Path("docs/data").glob("bench-*.json")):
    print(f"### {path.stem.removeprefix('bench-')}\n")
    print(markdown(json.loads(path.read_text())))
    print()
