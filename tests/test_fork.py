"""The fork builds, installs and runs: identity through the CLI, the bindings and the server."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, n_threads, run_cli

from ridgefill._version import UPSTREAM_SHA256, __version__

PROMPT = "The three primary colors are"


def series_id() -> str:
    r = subprocess.run([sys.executable, str(ROOT / "scripts/prepare_upstream.py"), "--dest", "/nonexistent",
                        "--patches", str(ROOT / "ggml-patches"), "--print-series"],
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_version_names_pin_and_patch_series():
    r = run_cli("ridgefill", "--version")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"ridgefill {__version__}" in out
    assert f"llama-cpp-python 0.3.36 (sha256 {UPSTREAM_SHA256[:12]})" in out
    patches = sorted(p.name[:4] for p in (ROOT / "ggml-patches").glob("*.patch"))
    assert f"{series_id()} ({len(patches)} patches: {','.join(patches)})" in out


def test_bindings_load_the_fork():
    import llama_cpp

    from ridgefill._lib import fork_identity
    info = llama_cpp.llama_print_system_info().decode()
    assert info.startswith(f"RIDGEFILL : VERSION = {__version__} |")
    assert fork_identity()["patch_series"].startswith(series_id())
    # one library: the bindings' libllama is the one shipped next to them
    lib = fork_identity()["library"]
    assert lib.startswith(str(Path(llama_cpp.__file__).parent / "lib")), lib


def test_one_distribution_owns_llama_cpp_and_satisfies_dependents():
    dist = importlib.metadata.distribution("llama-cpp-python")
    assert dist.version == f"0.3.36+ridgefill.{__version__}"
    files = {str(f) for f in dist.files}
    assert "llama_cpp/__init__.py" in files and "ridgefill/__init__.py" in files
    # a package that depends on llama-cpp-python is satisfied by the fork, so pip keeps it
    for req in ("llama-cpp-python==0.3.36", "llama-cpp-python>=0.3"):
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", req],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "Would install" not in r.stdout, r.stdout


def test_the_wheel_holds_each_library_once():
    """CMakeLists.txt unversions the libraries: a wheel stores symlinks as copies (3 x 59 MB for ggml-cuda)."""
    import shutil

    import llama_cpp
    lib = Path(llama_cpp.__file__).parent / "lib"
    names = sorted(p.name for p in lib.iterdir() if ".so" in p.name)
    assert "libllama.so" in names and "libggml.so" in names
    assert all(n.endswith(".so") for n in names), names  # no libX.so.0 / libX.so.0.25.3 copies
    if shutil.which("readelf"):  # each links the others by these names, and finds them beside itself
        for name in names:
            dyn = subprocess.run(["readelf", "-d", str(lib / name)], capture_output=True, text=True).stdout
            needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
            assert f"Library soname: [{name}]" in dyn, (name, dyn)
            ours = [n for n in needed if n.startswith(("libllama", "libggml", "libmtmd"))]
            assert all(n in names for n in ours), (name, needed)


@pytest.mark.slow
def test_bindings_and_server_generate_the_same_text(smollm2):
    from llama_cpp import Llama

    from ridgefill.server import Server
    llm = Llama(model_path=str(smollm2), n_ctx=512, n_batch=512, n_threads=n_threads(), verbose=False)
    text = llm.create_completion(PROMPT, max_tokens=32, temperature=0.0)["choices"][0]["text"]
    del llm
    assert len(text.strip()) > 0
    # same numerics as the bindings: no flash attention (llama-server defaults to auto), one slot
    with Server(smollm2, "-c", "512", "-b", "512", "-t", str(n_threads()), "-np", "1", "-fa", "off") as srv:
        res = srv.post("/completion", {"prompt": PROMPT, "n_predict": 32, "temperature": 0.0})
        props = srv.get("/props")
    assert res["content"] == text
    assert props["ridgefill"]["version"] == __version__
    assert props["ridgefill"]["upstream"].startswith("llama-cpp-python 0.3.36")
    assert props["ridgefill"]["patch_series"].startswith(series_id())


def test_server_wrapper_runs_the_patched_binary():
    r = run_cli("ridgefill-server", "--version")
    assert r.returncode == 0, r.stderr
    assert "version" in (r.stdout + r.stderr)
