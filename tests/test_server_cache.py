"""ridgefill-server across requests: no path that keeps or moves KV cells between requests serves an exact
request an approximately filled cell (or one computed on top of one), and chat turns keep their cache.

Each path of docs/runtime.md ("Prompt cache and fill record") is driven through the real server: slot reuse,
the RAM prompt cache (on by default), /slots save and restore, --cache-reuse chunk shifting, context shift,
and the sliding-window checkpoints of Gemma 3.  Every prompt starts with its own header line, so tests do not
share prefixes.
"""
import struct

import pytest
import requests
from conftest import n_threads

from ridgefill.server import Server

TAIL, SINK = 64, 4
MAGIC = 0x52464C52  # cpp/ridgefill-record.h: the fill record's mark at the end of a slot file


@pytest.fixture(scope="module")
def text(smollm2, prose_tokens):
    from llama_cpp import Llama
    llm = Llama(model_path=str(smollm2), n_ctx=256, verbose=False, vocab_only=True)
    return llm.detokenize(prose_tokens[1:620]).decode(errors="ignore")   # ~620 tokens


@pytest.fixture(scope="module")
def more():
    """About 200 tokens of other prose, to extend a conversation."""
    from ridgefill import data
    return data.text("shakespeare")[30000:30750]


@pytest.fixture(scope="module")
def srv(smollm2, maps20, tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    with Server(smollm2, "-c", "1024", "-b", "1024", "-t", str(n_threads()), "-np", "1", "-fa", "off",
                "--ridgefill-maps", str(maps20), "--ridgefill-tail", str(TAIL), "--context-shift",
                "--slot-save-path", str(slots)) as s:
        s.slots = slots
        yield s


def complete(srv, prompt, **body):
    r = requests.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0.0,
                                                     "n_probs": 3, **body}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def top1(res):
    return res["completion_probabilities"][0]["top_logprobs"][0]


def assert_exact(srv, res, prompt):
    """`res` answers as a fresh exact prefill of `prompt` (no cache) does: same text, same top-1 logprob."""
    ref = complete(srv, prompt, ridgefill=False, cache_prompt=False, n_predict=res["timings"]["predicted_n"])
    assert res["content"] == ref["content"]
    assert top1(res)["id"] == top1(ref)["id"]
    assert abs(top1(res)["logprob"] - top1(ref)["logprob"]) < 0.02, (top1(res), top1(ref))


def test_exact_request_after_an_approximate_one_is_exact(srv, text):
    """The reproduction of issue #9: P filled, another prompt Q, then P exact: P's filled cells come back
    through the RAM prompt cache and must not be reused."""
    p, q = "Reproduction.\n" + text, "Something else entirely.\n" + text[1000:]
    first = complete(srv, p, ridgefill={"tail_tokens": TAIL})
    assert first["timings"]["ridgefill_filled_n"] > 500
    complete(srv, q, ridgefill=False)
    exact = complete(srv, p, ridgefill=False)
    assert exact["timings"]["cache_n"] <= SINK
    assert exact["timings"]["ridgefill_filled_n"] == 0
    assert_exact(srv, exact, p)


def test_ram_prompt_cache_keeps_the_record_for_approximate_reuse(srv, text):
    a, b = "RAM cache A.\n" + text, "RAM cache B.\n" + text[800:]
    first = complete(srv, a)
    n = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    complete(srv, b, ridgefill=False)                    # a's cells go to the RAM cache with their record
    again = complete(srv, a)                             # the same fill: everything is reused
    assert again["timings"]["cache_n"] == n - 1
    exact = complete(srv, b, ridgefill=False)            # b was exact: reused as a whole by an exact request
    assert exact["timings"]["cache_n"] >= exact["timings"]["prompt_n"] + exact["timings"]["cache_n"] - 1


def test_chat_turns_keep_their_cache(srv, text, more):
    """Turn 2 extends turn 1's prompt and answer: RidgeFill reuses all of turn 1 and fills only the new part."""
    turn1 = "Chat.\n" + text
    r1 = complete(srv, turn1, n_predict=16)
    n1 = r1["timings"]["prompt_n"] + r1["timings"]["cache_n"]
    assert r1["timings"]["ridgefill_filled_n"] == n1 - TAIL - SINK
    turn2 = turn1 + r1["content"] + "\n" + more
    r2 = complete(srv, turn2)
    n2 = r2["timings"]["prompt_n"] + r2["timings"]["cache_n"]
    assert r2["timings"]["cache_n"] >= n1 - 2                       # turn 1 (and most of its answer) reused
    assert r2["timings"]["ridgefill_filled_n"] == r2["timings"]["prompt_n"] - TAIL
    exact = complete(srv, turn2, ridgefill=False)                   # and an exact request still gets exact cells
    assert exact["timings"]["cache_n"] <= SINK and n2 > n1
    assert_exact(srv, exact, turn2)
    longer_tail = complete(srv, turn2, ridgefill={"tail_tokens": 300})  # exact cells serve any fill
    assert longer_tail["timings"]["cache_n"] == n2 - 1


def test_slot_files_carry_the_record(srv, text):
    p = "Slot file.\n" + text
    first = complete(srv, p, id_slot=0)
    n = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    assert requests.post(srv.url + "/slots/0?action=save", json={"filename": "p.bin"}, timeout=120).status_code == 200
    raw = (srv.slots / "p.bin").read_bytes()                        # magic, version, n, the n "tokens", the state
    n_words = struct.unpack_from("<I", raw, 8)[0]
    words = struct.unpack_from(f"<{n_words}i", raw, 12)
    assert words[-4:] == (SINK, n - TAIL, 1, MAGIC)                 # the filled range, their count, the mark
    for exact in (True, False):
        assert requests.post(srv.url + "/slots/0?action=erase", timeout=60).status_code == 200
        r = requests.post(srv.url + "/slots/0?action=restore", json={"filename": "p.bin"}, timeout=120)
        assert r.status_code == 200 and r.json()["n_restored"] >= n, r.text
        res = complete(srv, p, id_slot=0, ridgefill=not exact)
        if exact:                                                   # the filled cells came back marked
            assert res["timings"]["cache_n"] <= SINK
            assert_exact(srv, res, p)
        else:                                                       # and still serve the same fill
            assert res["timings"]["cache_n"] == n - 1


def test_cache_reuse_does_not_shift_filled_chunks(srv, text):
    p = "Chunks.\n" + text
    complete(srv, p)
    moved = "A different first line, then the same text.\n" + text
    res = complete(srv, moved, ridgefill=False, n_cache_reuse=16)
    assert res["timings"]["cache_n"] < 16
    assert_exact(srv, res, moved)


def test_context_shift_keeps_cells_marked(srv, prose_tokens, smollm2):
    """A generation that overflows the context drops cells after n_keep and moves the rest down: the moved
    cells were computed on top of filled ones and stay marked."""
    from llama_cpp import Llama
    vocab = Llama(model_path=str(smollm2), n_ctx=256, verbose=False, vocab_only=True)
    p = "Context shift.\n" + vocab.detokenize(prose_tokens[1:950]).decode(errors="ignore")
    res = complete(srv, p, n_predict=110, n_keep=10, ignore_eos=True)   # 950 + 110 > the 1,024 context
    assert res["truncated"] and res["timings"]["ridgefill_filled_n"] > 800
    exact = complete(srv, p, ridgefill=False)
    assert exact["timings"]["cache_n"] <= SINK
    assert_exact(srv, exact, p)


@pytest.mark.parametrize("bad", [4294967301, 2 ** 31, -1, 0, None, 1.5, "12", [1], {"n": 1}])
def test_hostile_tail_tokens_are_400(srv, bad):
    r = requests.post(srv.url + "/completion", json={"prompt": "x", "n_predict": 1,
                                                     "ridgefill": {"tail_tokens": bad}}, timeout=60)
    assert r.status_code == 400, (bad, r.text)
    assert "tail_tokens" in r.json()["error"]["message"]
    assert requests.get(srv.url + "/health", timeout=10).status_code == 200


def test_largest_tail_is_accepted(srv, text):
    res = complete(srv, "Largest tail.\n" + text[:2000], ridgefill={"tail_tokens": 2 ** 31 - 1}, n_predict=1)
    assert res["timings"]["ridgefill_filled_n"] == 0


def test_gemma3_sliding_window_checkpoints(gemma3, gemma_maps):
    """Gemma 3 keeps only a 512-token window in its SWA layers and restores older positions from checkpoints:
    the reuse rule is applied before the checkpoint search, so an exact request after a filled one is exact,
    and a chat's next turn reuses the cache."""
    from llama_cpp import Llama

    from ridgefill import data
    vocab = Llama(model_path=str(gemma3), n_ctx=256, verbose=False, vocab_only=True)
    toks = vocab.tokenize(data.text("shakespeare")[30000:60000].encode(), add_bos=False)
    p = vocab.detokenize(toks[:1000]).decode(errors="ignore")                 # twice the window
    with Server(gemma3, "-c", "2048", "-b", "2048", "-t", str(n_threads()), "-np", "1", "-fa", "off",
                "--ridgefill-maps", str(gemma_maps), "--ridgefill-tail", "256") as s:
        first = complete(s, p, n_predict=8)
        assert first["timings"]["ridgefill_filled_n"] > 700
        exact = complete(s, p, ridgefill=False)
        assert exact["timings"]["cache_n"] <= SINK
        assert_exact(s, exact, p)
        turn1 = "Another conversation.\n" + p
        r1 = complete(s, turn1, n_predict=8)
        turn2 = turn1 + r1["content"] + vocab.detokenize(toks[1000:1300]).decode(errors="ignore")
        r2 = complete(s, turn2)
        assert r2["timings"]["cache_n"] >= r1["timings"]["prompt_n"] // 2   # (the window may restore a checkpoint)
        assert r2["timings"]["ridgefill_filled_n"] == r2["timings"]["prompt_n"] - 256
