"""What the tiled CPU flash attention spends on the key tiles a band's window masks: one band layer's attention of a
ubatch, timed in one process with two builds of libggml-cpu, interleaved.

    python scripts/fa_tile_bench.py OLD/libggml-cpu.so NEW/libggml-cpu.so [-r 15] [--json OUT.json]

The op is SmolLM2-135M's (9 query heads on 3 KV heads, head size 64, F16 cache), a 512-row ubatch at positions
p..p+511 of a prompt (n_kv = p + 512 keys), with three masks: causal (an unwindowed fill), the band's (the first 4
positions and each row's 1024 latest) and the band's with only the keys it can see (the cache cut to positions
p-1024.. and no sink: what the op would cost if a masked tile cost nothing, one tile fewer).  Per build and mask:
the median (and the least) time of the op over the repeats, each repeat running every (build, mask) once in
rotation, the build that runs an op first alternating.  Used for docs/maps.md, "A masked tile's cost, at the kernel".
"""
import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import numpy as np

import llama_cpp

LIB = Path(llama_cpp.__file__).parent / "lib"   # the fork's libraries, as installed
F32, F16 = 0, 1                                 # ggml_type


class InitParams(ctypes.Structure):
    """struct ggml_init_params"""
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

HEADS, KV_HEADS, D, ROWS, WINDOW, SINK = 9, 3, 64, 512, 1024, 4


def load(cpu_path: str, mode: int = ctypes.RTLD_LOCAL):
    """The fork's libggml-base and the libggml-cpu at cpu_path, with the few functions used here declared."""
    base = ctypes.CDLL(str(LIB / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(cpu_path, mode=mode)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, res, args in (("ggml_init", p, [InitParams]), ("ggml_free", None, [p]),
                            ("ggml_new_tensor_4d", p, [p, ctypes.c_int, i64, i64, i64, i64]),
                            ("ggml_flash_attn_ext", p, [p, p, p, p, p] + [ctypes.c_float] * 3),
                            ("ggml_new_graph", p, [p]), ("ggml_build_forward_expand", None, [p, p]),
                            ("ggml_get_data", p, [p]), ("ggml_nbytes", ctypes.c_size_t, [p])):
        getattr(base, name).restype, getattr(base, name).argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype, cpu.ggml_graph_compute_with_ctx.argtypes = ctypes.c_int, [p, p, ctypes.c_int]
    return base, cpu


class Op:
    """One flash-attention op over keys first..n_kv-1 for rows at positions p..p+ROWS-1, with a mask kind."""

    def __init__(self, base, p: int, kind: str, rng):
        self.base = base
        n_kv, first = p + ROWS, (p - WINDOW if kind == "seen-only" else 0)
        self.ctx = base.ggml_init(InitParams(512 << 20, None, False))

        def tensor(t, values):
            x = base.ggml_new_tensor_4d(self.ctx, t, *values.shape[::-1])
            buf = (ctypes.c_char * base.ggml_nbytes(x)).from_address(base.ggml_get_data(x))
            np.frombuffer(buf, dtype=values.dtype)[:] = values.ravel()
            return x
        q = tensor(F32, rng.standard_normal((1, HEADS, ROWS, D), dtype=np.float32))
        k = tensor(F16, rng.standard_normal((1, KV_HEADS, n_kv - first, D)).astype(np.float16))
        v = tensor(F16, rng.standard_normal((1, KV_HEADS, n_kv - first, D)).astype(np.float16))
        pos, key = np.arange(p, n_kv)[:, None], np.arange(first, n_kv)[None, :]
        seen = key <= pos
        if kind != "causal":
            seen &= (key > pos - WINDOW) | (key < SINK if kind == "band" else False)
        self.tiles = int(seen.reshape(ROWS // 64, 64, -1, 64).any(axis=(1, 3)).sum())
        mask = tensor(F16, np.where(seen, 0.0, -np.inf).astype(np.float16)[None, None])
        out = base.ggml_flash_attn_ext(self.ctx, q, k, v, mask, ctypes.c_float(D ** -0.5), ctypes.c_float(0.0),
                                       ctypes.c_float(0.0))
        self.gf = base.ggml_new_graph(self.ctx)
        base.ggml_build_forward_expand(self.gf, out)

    def time(self, cpu, threads: int) -> float:
        t = time.perf_counter()
        assert cpu.ggml_graph_compute_with_ctx(self.ctx, self.gf, threads) == 0
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs=2, metavar="LIBGGML_CPU")
    ap.add_argument("--positions", default="1024,4096,7680")
    ap.add_argument("-r", "--repeats", type=int, default=15)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    builds = [load(path) for path in a.libs]
    assert builds[0][1]._handle != builds[1][1]._handle, "the two libggml-cpu builds must be two files"
    base = builds[0][0]
    rng = np.random.default_rng(0)
    kinds = ("causal", "band", "seen-only")
    ops = {(p, kind): Op(base, p, kind, rng) for p in map(int, a.positions.split(",")) for kind in kinds}
    times = {(b, key): [] for b in range(2) for key in ops}
    for r in range(a.repeats):
        for key, op in ops.items():
            for b in ((0, 1), (1, 0))[r % 2]:       # which build runs first (on data the other left warm) alternates
                times[b, key].append(op.time(builds[b][1], a.threads))
    rows = []
    names = [Path(x).parent.name + "/" + Path(x).name for x in a.libs]
    print(f"| position | mask | key tiles computed | ms, {names[0]} (min) | ms, {names[1]} (min) | second / first |"
          "\n|---|---|---|---|---|---|")
    for (p, kind), op in ops.items():
        med = [statistics.median(times[b, (p, kind)]) * 1e3 for b in range(2)]
        low = [min(times[b, (p, kind)]) * 1e3 for b in range(2)]
        rows.append({"position": p, "mask": kind, "tiles": op.tiles, "ms": med, "min_ms": low,
                     "runs_ms": [[x * 1e3 for x in times[b, (p, kind)]] for b in range(2)]})
        print(f"| {p} | {kind} | {op.tiles} | {med[0]:.2f} ({low[0]:.2f}) | {med[1]:.2f} ({low[1]:.2f}) "
              f"| {med[1] / med[0]:.3f} ({low[1] / low[0]:.3f}) |")
    if a.json:
        Path(a.json).write_text(json.dumps({"libs": a.libs, "threads": a.threads, "repeats": a.repeats,
                                            "heads": [HEADS, KV_HEADS, D], "rows_per_ubatch": ROWS,
                                            "window": WINDOW, "sink": SINK, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
