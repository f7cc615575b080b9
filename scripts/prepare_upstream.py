#!/usr/bin/env python3
"""Obtain the pinned upstream tree and lay our patch series over it.

Used by CMakeLists.txt at configure time (stdlib only, it runs inside pip's
isolated build environment).  Steps:

1. Unless step 2 was done before, get `llama_cpp_python-0.3.36.tar.gz` (the llama-cpp-python sdist, which
   vendors llama.cpp) into the cache with `pip download`, unless it is already
   there or RIDGEFILL_UPSTREAM_SDIST names a local copy.  Verify its sha256.
2. Unpack it once into the cache (the pristine tree).
3. Keep a patched working copy in DEST.  Files touched by a patch are rebuilt
   from the pristine tree and the whole series is applied in order with
   `git apply`; a patch that does not apply stops with its name.  Only files
   whose content changed are rewritten, so an incremental build recompiles
   just what a patch edit touched.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PIN_NAME = "llama-cpp-python"
PIN_VERSION = "0.3.36"
PIN_FILE = f"llama_cpp_python-{PIN_VERSION}.tar.gz"
PIN_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
STATE_FILE = ".ridgefill-patches.json"


def cache_root() -> Path:
    env = os.environ.get("RIDGEFILL_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ridgefill"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def die(msg: str) -> None:
    print(f"prepare_upstream: error: {msg}", file=sys.stderr)
    sys.exit(1)


def fetch_sdist(cache: Path) -> Path:
    local = os.environ.get("RIDGEFILL_UPSTREAM_SDIST")
    if local:
        path = Path(local)
        if not path.is_file():
            die(f"RIDGEFILL_UPSTREAM_SDIST={local} is not a file")
    else:
        dl = cache / "upstream"
        path = dl / PIN_FILE
        if path.is_file() and sha256_of(path) != PIN_SHA256:
            print(f"prepare_upstream: cached {path} has a wrong sha256, fetching it again")
            path.unlink()
        if not path.is_file():
            dl.mkdir(parents=True, exist_ok=True)
            print(f"prepare_upstream: downloading {PIN_NAME}=={PIN_VERSION} (sdist, ~77 MB)")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--no-build-isolation", f"{PIN_NAME}=={PIN_VERSION}", "-d", str(dl)]
            r = subprocess.run(cmd)
            if r.returncode != 0 or not path.is_file():
                die(f"could not download {PIN_NAME}=={PIN_VERSION} with pip; download it by hand and "
                    f"set RIDGEFILL_UPSTREAM_SDIST=/path/to/{PIN_FILE}")
    digest = sha256_of(path)
    if digest != PIN_SHA256:
        die(f"{path} has sha256 {digest}, expected {PIN_SHA256} (pinned {PIN_NAME}=={PIN_VERSION})")
    return path


def unpacked_tree(cache: Path) -> Path | None:
    """The pristine tree, if an earlier run unpacked (and verified) it: then no download is needed (offline
    machines get it this way too, e.g. scripts/gpu_check.sh's kit)."""
    root = cache / "upstream" / f"pristine-{PIN_SHA256[:16]}"
    return root / f"llama_cpp_python-{PIN_VERSION}" if (root / ".complete").is_file() else None


def pristine_tree(cache: Path, sdist: Path) -> Path:
    root = cache / "upstream" / f"pristine-{PIN_SHA256[:16]}"
    top = root / f"llama_cpp_python-{PIN_VERSION}"
    if (root / ".complete").is_file():
        return top
    shutil.rmtree(root, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="pristine-", dir=cache / "upstream"))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
    (tmp / ".complete").write_text(PIN_SHA256 + "\n")
    os.replace(tmp, root)
    return top


def touched_files(patch: Path) -> set[str]:
    """Paths (relative to the sdist root) that a git-style patch creates or edits."""
    out = set()
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null" and name[:2] in ("a/", "b/"):
                out.add(name[2:])
    return out


def series_id(patches: list[Path]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def apply_series(pristine: Path, dest: Path, patches: list[Path]) -> None:
    state_path = dest / STATE_FILE
    if not (dest / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        print(f"prepare_upstream: copying the pristine tree to {dest}")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(pristine, dest, symlinks=True)
        state = {"series": None, "files": []}
    else:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {"series": None, "files": []}
    sid = series_id(patches)
    if state.get("series") == sid:
        return
    files = set(state.get("files", []))
    new_files: set[str] = set()
    for p in patches:
        new_files |= touched_files(p)
    files |= new_files
    with tempfile.TemporaryDirectory(prefix="ridgefill-patch-") as tmp:
        stage = Path(tmp)
        for rel in sorted(files):
            src = pristine / rel
            if src.is_file():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, stage / rel)
        for p in patches:
            r = subprocess.run(["git", "apply", "--whitespace=nowarn", str(p)], cwd=stage,
                               capture_output=True, text=True)
            if r.returncode != 0:
                die(f"patch {p.name} does not apply to {PIN_NAME}=={PIN_VERSION}:\n{r.stderr.strip()}")
            print(f"prepare_upstream: applied {p.name}")
        changed = 0
        for rel in sorted(files):
            staged, target = stage / rel, dest / rel
            if staged.is_file():
                data = staged.read_bytes()
                if not target.is_file() or target.read_bytes() != data:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                    changed += 1
            elif target.exists():
                target.unlink()
                changed += 1
    state_path.write_text(json.dumps({"series": sid, "files": sorted(new_files)}, indent=1))
    print(f"prepare_upstream: patch series {sid}: {len(patches)} patches, {changed} files rewritten")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", required=True, type=Path, help="patched working copy of the sdist tree")
    ap.add_argument("--patches", required=True, type=Path, help="directory holding *.patch, applied in name order")
    ap.add_argument("--print-series", action="store_true", help="print the patch series id and exit")
    args = ap.parse_args()
    patches = sorted(args.patches.glob("*.patch"))
    if args.print_series:
        print(series_id(patches))
        return
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    # an sdist named by RIDGEFILL_UPSTREAM_SDIST is always verified; else an unpacked tree needs no sdist
    pristine = (None if os.environ.get("RIDGEFILL_UPSTREAM_SDIST") else unpacked_tree(cache)) \
        or pristine_tree(cache, fetch_sdist(cache))
    apply_series(pristine, args.dest.resolve(), patches)


if __name__ == "__main__":
    main()
