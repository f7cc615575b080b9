"""`ridgefill bench --server URL --chat N`: a conversation through the prompt cache, exact vs RidgeFill, per turn."""
import json

import pytest
from conftest import n_threads, run_cli

from ridgefill import bench
from ridgefill.server import Server

TURNS, TURN_TOKENS, TAIL, SINK = 2, 256, 64, 4


@pytest.fixture(scope="module")
def srv(smollm2, maps20):
    with Server(smollm2, "-c", "4096", "-t", str(n_threads()), "-np", "1", "--ridgefill-maps", str(maps20),
                "--ridgefill-tail", str(TAIL)) as s:
        yield s


def check_chat(result: dict) -> None:
    assert result["turns"] == TURNS and result["turn_tokens"] == TURN_TOKENS and result["tail_tokens"] == TAIL
    rows = result["rows"]
    assert [r["turn"] for r in rows] == [1, 2]
    for r in rows:
        assert r["exact_ms"] > 0 and r["ridgefill_ms"] > 0 and r["exact_wall_ms"] > 0 and r["ridgefill_wall_ms"] > 0
        assert 0 < r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    assert rows[1]["tokens"] > rows[0]["tokens"] + TURN_TOKENS - 8
    for mode in ("exact", "ridgefill"):
        convs = result["runs"][mode]
        assert len(convs) == result["repeats"]
        for conv in convs:
            assert len(conv) == TURNS
            for t in conv:
                assert t["prompt_ms"] > 0 and t["wall_ms"] >= t["prompt_ms"] and t["prompt_n"] >= 1
                assert t["prompt_n"] + t["cache_n"] == t["tokens"], (mode, t)
            assert conv[0]["cache_n"] <= SINK                 # a fresh conversation shares no prefix but a header's start
            assert conv[1]["tokens"] > conv[0]["tokens"]
            if mode == "exact":
                assert all(t["filled_n"] == 0 for t in conv)
                assert conv[1]["cache_n"] > conv[0]["tokens"] // 2      # turn 2 reuses turn 1's cells
            else:
                assert conv[0]["filled_n"] == conv[0]["tokens"] - TAIL - SINK
                # needs the reuse rule of patch 0008
                assert conv[1]["cache_n"] > conv[0]["tokens"] // 2


def test_chat_bench_through_the_server(srv, tmp_path):
    result = bench.run_chat(srv.url, TURNS, TURN_TOKENS, None, 1, progress=lambda *_: None)
    check_chat(result)
    assert "turn 1" in bench.chat_targets(result)[0] and "later turns" in bench.chat_targets(result)[1]
    assert bench.markdown(result).count("\n| ") == TURNS + 1
    pytest.importorskip("matplotlib")
    bench.plot(result, tmp_path / "chat.png")
    assert (tmp_path / "chat.png").stat().st_size > 0


def test_chat_bench_cli_json(srv, tmp_path):
    out = tmp_path / "chat.json"
    r = run_cli("ridgefill", "bench", "--server", srv.url, "--chat", str(TURNS), "--turn-tokens", str(TURN_TOKENS),
                "--tail-tokens", str(TAIL), "-r", "1", "--json", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "later turns, ratio >= 0.95" in r.stdout
    check_chat(json.loads(out.read_text()))


def test_chat_needs_a_server():
    r = run_cli("ridgefill", "bench", "--chat", "2", timeout=60)
    assert r.returncode == 1 and "--chat measures through a server" in r.stderr
