#!/usr/bin/env python3
"""Write a synthetic GGUF of a real model's shape (ridgefill.synthetic): random weights, for speed, memory and
plumbing only — never quality.

    python scripts/make_synthetic.py llama-3.1-8b -o llama8b.gguf --type q4_0
    python scripts/make_synthetic.py tiny-gemma3 -o tiny.gguf
    python scripts/make_synthetic.py llama-3.2-1b -o 1b.gguf --header-only --maps 1b.maps.gguf --split-layer 8
    python scripts/make_synthetic.py --tokenizer-only -o tokenizer.gguf   # for machines that cannot fetch SmolLM2
"""
import argparse
import sys

from ridgefill import synthetic
from ridgefill.errors import RidgefillError

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("shape", nargs="?", choices=list(synthetic.SPECS))
ap.add_argument("-o", "--output", required=True)
ap.add_argument("--type", default="q8_0", choices=list(synthetic.MODEL_TYPES), help="type of the weight matrices")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--header-only", action="store_true",
                help="tensor data left as zeros in a sparse file: exact size, names, shapes, metadata; instant")
ap.add_argument("--maps", help="also write random maps (never fitted: speed and plumbing only) for --split-layer")
ap.add_argument("--split-layer", type=int, help="split layer of --maps (default: the middle layer)")
ap.add_argument("--map-type", default="f16", choices=["f32", "f16", "q8_0"])
ap.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizer the models carry")
args = ap.parse_args()
if args.tokenizer_only:
    print(f"wrote {synthetic.write_tokenizer(args.output)}: SmolLM2's tokenizer, no tensors")
    sys.exit(0)
if not args.shape:
    ap.error("give a shape (or --tokenizer-only)")
try:
    path = synthetic.write(args.shape, args.output, args.type, seed=args.seed, weights=not args.header_only,
                           progress=sys.stderr.isatty())
except RidgefillError as e:
    sys.exit(f"make_synthetic: error: {e}")
print(f"wrote {path}: {args.shape}, {args.type}, {path.stat().st_size / 1e9:.3f} GB"
      + (" (header only: zero weights)" if args.header_only else " (random weights: never for quality)"))
if args.maps:
    split = args.split_layer or synthetic.SPECS[args.shape].shape.n_layer // 2
    synthetic.write_maps(path, split, args.maps, args.map_type, seed=args.seed)
    print(f"wrote {args.maps}: random maps for split layer {split} ({args.map_type}; never fitted)")
