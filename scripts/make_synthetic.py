#!/usr/bin/env python3
"""Write a synthetic GGUF of a real model's shape (ridgefill.synthetic): random weights, for speed, memory and
plumbing only — never quality.

    python scripts/make_synthetic.py llama-3.1-8b -o llama8b.gguf --type q4_0
    python scripts/make_synthetic.py tiny-gemma3 -o tiny.gguf
"""
import argparse
import sys

from ridgefill import synthetic
from ridgefill.errors import RidgefillError

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("shape", choices=list(synthetic.SPECS))
ap.add_argument("-o", "--output", required=True)
ap.add_argument("--type", default="q8_0", choices=list(synthetic.MODEL_TYPES), help="type of the weight matrices")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--header-only", action="store_true",
                help="tensor data left as zeros in a sparse file: exact size, names, shapes, metadata; instant")
args = ap.parse_args()
try:
    path = synthetic.write(args.shape, args.output, args.type, seed=args.seed, weights=not args.header_only,
                           progress=sys.stderr.isatty())
except RidgefillError as e:
    sys.exit(f"make_synthetic: error: {e}")
print(f"wrote {path}: {args.shape}, {args.type}, {path.stat().st_size / 1e9:.3f} GB"
      + (" (header only: zero weights)" if args.header_only else " (random weights: never for quality)"))
