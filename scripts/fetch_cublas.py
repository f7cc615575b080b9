#!/usr/bin/env python3
"""Unpack cuBLAS headers and libraries from the PyPI wheel `nvidia-cublas` into the cache.

For CUDA builds on machines whose toolkit has nvcc but no cuBLAS:

    export RIDGEFILL_CUBLAS_ROOT=$(python scripts/fetch_cublas.py)
    CMAKE_ARGS="-DGGML_CUDA=on" pip install .
"""
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "13.10.0.20"


def main() -> None:
    root = Path(os.environ.get("RIDGEFILL_CACHE", Path.home() / ".cache" / "ridgefill")) / f"cublas-{VERSION}"
    if not (root / ".complete").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                            f"nvidia-cublas=={VERSION}", "-d", tmp], check=True, stdout=sys.stderr)
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z:
                for m in z.namelist():
                    parts = Path(m).parts
                    if len(parts) > 3 and parts[0] == "nvidia" and parts[2] in ("include", "lib"):
                        dest = root.joinpath(*parts[2:])
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(z.read(m))
        for lib in (root / "lib").glob("lib*.so.*"):  # unversioned names for the linker
            link = lib.with_name(lib.name.split(".so")[0] + ".so")
            if not link.exists():
                link.symlink_to(lib.name)
        (root / ".complete").write_text(VERSION + "\n")
    print(root)


if __name__ == "__main__":
    main()
