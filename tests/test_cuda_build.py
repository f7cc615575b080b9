"""CMAKE_ARGS="-DGGML_CUDA=on" configures the CUDA backend and compiles CUDA code here (nvcc, no GPU).

Configures the same top-level CMakeLists.txt that `pip install .` uses, then compiles
our own CUDA sources (cpp/cuda/*.cu, compiled into ggml-cuda) and one small upstream
ggml-cuda kernel as a toolchain check, and links them into a shared library against the
fork's ggml-base, cudart and cuBLAS, all of which must be found.  A complete CUDA wheel
takes 24.5 minutes on 2 cores for one architecture (docs/scale.md), too long for CI
beside the tests.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def test_cuda_configures_and_compiles(tmp_path):
    cublas = subprocess.run([sys.executable, str(ROOT / "scripts/fetch_cublas.py")], capture_output=True,
                            text=True, check=True).stdout.strip()
    env = {**os.environ, "RIDGEFILL_CUBLAS_ROOT": cublas}
    build = tmp_path / "build"
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DGGML_CUDA=on",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Including CUDA backend" in r.stdout
    # what the wheel installs (CMakeLists.txt): one unversioned libggml-cuda.so that looks beside itself and where
    # PyPI's nvidia-cublas / nvidia-cuda-runtime put their libraries
    install = (build / "cmake_install.cmake").read_text()
    assert 'FILES "%s/bin/libggml-cuda.so")' % build in install
    assert "libggml-cuda.so.0" not in install
    major = re.search(r"release (\d+)\.", subprocess.run(["nvcc", "--version"], capture_output=True,
                                                        text=True).stdout).group(1)
    assert r'NEW_RPATH "\$ORIGIN:\$ORIGIN/../../nvidia/cu%s/lib"' % major in install
    targets = subprocess.run(["ninja", "-C", str(build), "-t", "targets", "all"], capture_output=True,
                             text=True, check=True).stdout
    objects = [line.split(":")[0] for line in targets.splitlines()
               if ".cu.o:" in line and ("ggml-cuda.dir/arange.cu.o" in line or "/cpp/cuda/" in line)]
    ours = sorted((ROOT / "cpp" / "cuda").glob("*.cu")) if (ROOT / "cpp" / "cuda").is_dir() else []
    assert len(objects) == 1 + len(ours), objects
    r = subprocess.run(["ninja", "-C", str(build), *objects], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # link as ggml-cuda links (shared: the fork's ggml-base, cudart, cuBLAS, here the PyPI one)
    import llama_cpp
    base = Path(llama_cpp.__file__).parent / "lib"
    so = tmp_path / "libridgefill-cuda-check.so"
    r = subprocess.run(["nvcc", "-shared", "-o", str(so), *(str(build / o) for o in objects), "-lcudart",
                        "-Xlinker=--no-as-needed", f"-L{base}", "-lggml-base", f"-L{cublas}/lib", "-lcublas",
                        f"-Xlinker=-rpath,{base}:{cublas}/lib"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # every library it needs is found (loading it needs the rest of ggml-cuda: the complete build)
    deps = subprocess.run(["ldd", str(so)], capture_output=True, text=True, check=True).stdout
    assert "not found" not in deps, deps
    for lib in ("libcudart.so", "libcublas.so", "libggml-base.so"):
        assert lib in deps, deps
