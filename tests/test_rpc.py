"""Several machines through llama.cpp's RPC backend, on loopback: layers and their maps on
ridgefill-rpc-server processes give the local run's results, exact and with RidgeFill.

RPC devices are registered for the whole process (and upstream aborts when one stops answering), so each
run is its own Python process.
"""
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import n_threads, run_cli

import ridgefill
from ridgefill.errors import RidgefillError
from ridgefill.rpc import RpcServer, parse_endpoints
from ridgefill.server import Server

N_PROMPT, TAIL = 900, 256

RUN = r"""
import json, sys
import numpy as np
import ridgefill
from llama_cpp import llama_cpp as C
a = json.loads(sys.argv[1])
llm = ridgefill.Llama(a["model"], maps_path=a["maps"], tail_tokens=a["tail"], rpc_servers=a["rpc"],
                      n_gpu_layers=a["ngl"], n_ctx=1024, n_batch=1024, n_ubatch=512, n_threads=a["threads"],
                      verbose=False)
n_layer = C.llama_model_n_layer(llm.model)
out = {"placement": [[llm.placement(il), llm.placement(il, map=True)] for il in range(n_layer)]}
for on in (False, True):
    llm.set_ridgefill(on)
    llm.reset()
    llm.eval(a["tokens"])
    out["counts_" + str(on)] = llm.ridgefill_counts()
    out["logits_" + str(on)] = np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).tolist()
print("RESULT" + json.dumps(out))
"""


def run(smollm2, maps20, tokens, rpc=None, ngl=0):
    arg = dict(model=str(smollm2), maps=str(maps20), tail=TAIL, rpc=rpc, ngl=ngl, threads=n_threads(),
               tokens=list(tokens))
    r = subprocess.run([sys.executable, "-c", RUN, json.dumps(arg)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT", 1)[1])
    for k in [k for k in out if k.startswith("logits_")]:
        out[k] = np.array(out[k], dtype=np.float32)
    return out


@pytest.fixture(scope="module")
def local(smollm2, maps20, prose_tokens):
    return run(smollm2, maps20, prose_tokens[:N_PROMPT])


def assert_same_run(got, want):
    for on in (False, True):
        assert got[f"counts_{on}"] == want[f"counts_{on}"]
        a, b = got[f"logits_{on}"], want[f"logits_{on}"]
        assert np.abs(a - b).max() < 1e-3 * np.abs(b).max(), (on, np.abs(a - b).max())
        assert a.argmax() == b.argmax()
    assert want["counts_True"] == [N_PROMPT - TAIL - 4, TAIL + 4]


@pytest.mark.parametrize("ngl", [99, 6])
def test_rpc_servers_hold_layers_and_their_maps(smollm2, maps20, prose_tokens, local, ngl):
    """Two servers; all layers offloaded, or the last 6 (the maps of layers 21-23 then stay on the CPU)."""
    with RpcServer() as a, RpcServer() as b:
        got = run(smollm2, maps20, prose_tokens[:N_PROMPT], rpc=f"{a.endpoint},{b.endpoint}", ngl=ngl)
    assert_same_run(got, local)
    layers = [p for p, _ in got["placement"]]
    assert {"RPC0", "RPC1"} <= set(layers) and ("CPU" in layers) == (ngl < 30), layers  # split across both
    for il, (layer, map_) in enumerate(got["placement"]):
        assert map_ == (layer if il > 20 else None), (il, layer, map_)                  # maps beside their layer
    if ngl < 30:
        assert {m for _, m in got["placement"] if m} == {"CPU", "RPC0", "RPC1"}


def test_server_over_rpc_matches_the_local_server(smollm2, maps20, prose_tokens):
    from llama_cpp import Llama
    prompt = Llama(model_path=str(smollm2), vocab_only=True, verbose=False).detokenize(
        prose_tokens[1:N_PROMPT]).decode(errors="ignore")
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "n_probs": 5, "cache_prompt": False,
            "ridgefill": {"tail_tokens": TAIL}}
    # flash attention explicitly off: "auto" resolves differently once layers sit on an RPC device, and
    # decode steps then differ by up to 0.05 in logprob with RidgeFill on or off (measured)
    args = ("--ridgefill-maps", str(maps20), "-c", "2048", "-np", "1", "-t", str(n_threads()), "-fa", "off")
    with Server(smollm2, *args) as srv:
        want = srv.post("/completion", body)
    with RpcServer() as a, Server(smollm2, *args, "--rpc", a.endpoint, "-ngl", "99", "-lv", "4") as srv:
        got = srv.post("/completion", body)
        log = srv.log()
    assert "offloaded 31/31 layers" in log and re.search(r"ridgefill: loaded maps .*MiB on RPC0\[", log), log[-3000:]
    assert got["timings"]["ridgefill_filled_n"] == want["timings"]["ridgefill_filled_n"] > 0
    assert got["content"] == want["content"]
    for g, w in zip(got["completion_probabilities"], want["completion_probabilities"]):
        assert abs(g["logprob"] - w["logprob"]) < 1e-3


def test_bad_rpc_endpoints_are_clear_errors(smollm2):
    for spec in ["nonsense", "127.0.0.1", "127.0.0.1:port", ":50052", "127.0.0.1:70000", "127.0.0.1:5,"]:
        with pytest.raises(RidgefillError, match="not host:port"):
            parse_endpoints(spec)
    with pytest.raises(RidgefillError, match="'127.0.0.1' is not host:port"):
        ridgefill.Llama(str(smollm2), rpc_servers="127.0.0.1", n_gpu_layers=99, verbose=False)


def test_unreachable_rpc_server_is_a_clear_error(smollm2):
    from ridgefill.server import free_port
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RidgefillError, match=f"cannot reach RPC server {dead}"):
        ridgefill.Llama(str(smollm2), rpc_servers=dead, n_gpu_layers=99, verbose=False)
    r = run_cli("ridgefill-server", "-m", str(smollm2), "--rpc", dead, "-ngl", "99", timeout=60)
    assert r.returncode == 1 and f"cannot reach RPC server {dead}" in r.stderr, r.stderr[-2000:]
