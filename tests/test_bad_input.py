"""A non-GGUF or truncated model gives a clear error from ridgefill, the server wrapper and the bindings."""
import subprocess
import sys

import pytest
from conftest import run_cli

from ridgefill.errors import RidgefillError
from ridgefill.modelfile import check_gguf


@pytest.fixture
def not_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model\n")
    return p


@pytest.fixture
def truncated(tmp_path, smollm2):
    p = tmp_path / "truncated.gguf"
    with open(smollm2, "rb") as src:
        p.write_bytes(src.read(20_000_000))
    return p


def test_check_gguf_names_the_problem(tmp_path, not_gguf, truncated):
    with pytest.raises(RidgefillError, match="no such file"):
        check_gguf(tmp_path / "missing.gguf")
    with pytest.raises(RidgefillError, match="not a GGUF file"):
        check_gguf(not_gguf)
    with pytest.raises(RidgefillError, match="truncated GGUF"):
        check_gguf(truncated)


@pytest.mark.parametrize("which", ["not_gguf", "truncated"])
def test_cli_and_server_refuse_bad_models(which, request):
    path = str(request.getfixturevalue(which))
    for cmd in (["ridgefill", "demo", "-m", path], ["ridgefill-server", "-m", path]):
        r = run_cli(*cmd, timeout=120)
        assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        assert path in r.stderr and ("not a GGUF" in r.stderr or "truncated" in r.stderr), r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("which", ["not_gguf", "truncated"])
def test_bindings_raise_not_crash(which, request):
    path = str(request.getfixturevalue(which))
    code = ("from llama_cpp import Llama\n"
            "try:\n"
            f"    Llama(model_path={path!r}, verbose=False)\n"
            "except ValueError as e:\n"
            "    print('ValueError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"bindings crashed (rc={r.returncode}): {r.stderr[-2000:]}"
    assert "ValueError: Failed to load model from file" in r.stdout
