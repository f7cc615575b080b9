#!/usr/bin/env python3
"""Soak ridgefill-server: mixed traffic from concurrent clients, then its exact answers checked against a plain server.

    python scripts/soak.py --maps MAPS.gguf [--model MODEL.gguf] [--requests 200] [--clients 8] [--json soak.json]

A RidgeFill server (4 slots, so a unified KV cache) takes `--requests` requests from `--clients` threads: exact and
approximate /completion (tails 64/128/256), streaming, /v1/completions, 2–3 turn /v1/chat/completions chats and
clients that hang up mid-stream, on prompts of 200–1500 tokens cut from a few fixed prose windows, so that prefixes
repeat and the prompt cache is exercised. Every ~20 requests it checks /health and samples the server's RSS. Then a
reference server without RidgeFill (1 slot) answers every exact non-streaming /completion again with the prompt cache
off: the same greedy text, and how far the top-1 probabilities moved. Loopback only, bounded in requests and time;
exits 1 when the server died, a request failed, memory kept growing or an exact answer's top-1 probability moved by
more than --dp-fail (texts that part at a near-tie are reported, not failed: concurrent batches do that upstream
too, see the controls). Not a CI test.

Controls for the exact answers: `--exact-traffic` sends the same plan with every request exact (what concurrency
alone does), `--plain --exact-traffic` soaks a server without RidgeFill (same slots, unified KV cache).
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import sys
import time
import urllib.error
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ridgefill import data, models
from ridgefill.server import Server, http_get, http_post

TAILS = (64, 128, 256)
KINDS = {"exact": 3, "approx": 3, "stream": 2, "chat": 2, "v1": 1, "disconnect": 1}   # relative frequencies
HANG_UP_AFTER = 3            # events a disconnecting client reads
DP_NOISE = 0.02              # top-1 probability noise expected from unified-cache cell placement (counted)
DP_FAIL = 0.1                # ... a plain upstream server under the same concurrent load moves it by up to ~0.05


@dataclass
class Job:
    kind: str
    path: str
    body: dict
    follow_ups: list[str] = field(default_factory=list)   # chat: the user's later turns

    @property
    def requests(self) -> int:
        return 1 + len(self.follow_ups)


@dataclass
class Outcome:
    kind: str
    requests: int
    seconds: float = 0.0
    error: str | None = None
    skipped: bool = False
    body: dict | None = None     # exact non-streaming /completion: the request and its answer, for the reference
    answer: dict | None = None


class Prose:
    """Fixed windows of Shakespeare's tokens; a prompt is the text of a window's first n tokens, so prefixes repeat."""

    def __init__(self, model: Path, count: int = 4, length: int = 1600):
        from llama_cpp import Llama
        self.vocab = Llama(model_path=str(model), n_ctx=256, verbose=False, vocab_only=True)
        text = data.text("shakespeare")
        step = len(text) // count
        self.windows = [self.vocab.tokenize(text[i * step:i * step + 8 * length].encode(), add_bos=False)[:length]
                        for i in range(count)]

    def text(self, window: int, start: int, n: int) -> str:
        return self.vocab.detokenize(self.windows[window % len(self.windows)][start:start + n]).decode(errors="ignore")


def plan(prose: Prose, n_requests: int, rng: random.Random, exact_traffic: bool = False) -> list[Job]:
    """Jobs of every kind, in random order, until they make `n_requests` requests; with `exact_traffic` every
    request asks for exact prefill (the control: what concurrency alone does to exact answers)."""
    jobs, total = [], 0
    while total < n_requests:
        kind = rng.choices(list(KINDS), list(KINDS.values()))[0]
        w, n, n_predict = rng.randrange(len(prose.windows)), rng.randint(200, 1500), rng.randint(8, 16)
        fill = rng.choice([True, *({"tail_tokens": t} for t in TAILS)])
        fill = False if exact_traffic else fill             # the same plan otherwise
        base = {"prompt": prose.text(w, 0, n), "temperature": 0.0}
        if kind == "exact":
            job = Job(kind, "/completion", {**base, "n_predict": n_predict, "ridgefill": False, "n_probs": 3})
        elif kind == "approx":
            job = Job(kind, "/completion", {**base, "n_predict": n_predict, "ridgefill": fill})
        elif kind in ("stream", "disconnect"):
            job = Job(kind, "/completion", {**base, "n_predict": n_predict if kind == "stream" else 64,
                                            "ridgefill": rng.choice([False, fill]), "stream": True})
        elif kind == "v1":
            job = Job(kind, "/v1/completions", {**base, "max_tokens": n_predict, "ridgefill": rng.choice([False, fill]),
                                                "stream": rng.random() < 0.5})
        else:
            user = f"Read this passage.\n\n{prose.text(w, 0, min(n, 1000))}\n\nWhat happens next?"
            follow_ups = [f"Go on with this one:\n\n{prose.text(w + 1 + i, rng.randrange(1000), rng.randint(100, 300))}"
                          for i in range(rng.randint(1, 2))]
            job = Job(kind, "/v1/chat/completions", {"messages": [{"role": "user", "content": user}], "temperature": 0.0,
                                                     "max_tokens": n_predict, "ridgefill": rng.choice([False, fill])},
                      follow_ups)
        jobs.append(job)
        total += job.requests
    return jobs


class StreamError(Exception):
    pass


def stream(url: str, path: str, body: dict, timeout: float, hang_up_after: int | None = None) -> list:
    """POST a streaming request; its SSE events (dicts, and "[DONE]"), or the first `hang_up_after` of them, after
    which the connection is closed mid-stream."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise StreamError(f"http {resp.status}: {resp.read()[:200]!r}")
        events = []
        for line in resp:
            if line.startswith(b"error:"):
                raise StreamError(f"error event: {line[6:206]!r}")
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
                if hang_up_after and len(events) >= hang_up_after:
                    break
        return events
    finally:
        conn.close()


def chat(url: str, job: Job, timeout: float) -> None:
    """The turns of one conversation: each request resends the history with the answers so far."""
    messages = list(job.body["messages"])
    for follow_up in [None, *job.follow_ups]:
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
        res = http_post(url, job.path, {**job.body, "messages": messages}, timeout)
        messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or ""})


def execute(url: str, job: Job, timeout: float) -> Outcome:
    t0 = time.monotonic()
    out = Outcome(job.kind, job.requests)
    try:
        if job.kind == "chat":
            chat(url, job, timeout)
        elif job.body.get("stream"):
            events = stream(url, job.path, job.body, timeout, HANG_UP_AFTER if job.kind == "disconnect" else None)
            last = events[-1] if events else None
            complete = last == "[DONE]" or (isinstance(last, dict) and last.get("stop"))
            if job.kind != "disconnect" and not complete:
                raise StreamError(f"stream ended after {len(events)} events without its end")
        else:
            res = http_post(url, job.path, job.body, timeout)
            if "content" not in res and "choices" not in res:
                raise StreamError(f"no answer in {str(res)[:200]}")
            if job.kind == "exact":
                out.body, out.answer = job.body, res
    except urllib.error.HTTPError as e:
        out.error = f"http {e.code}: {e.read()[:200]!r}"
    except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException, StreamError) as e:
        out.error = f"{type(e).__name__}: {str(e)[:200]}"
    out.seconds = time.monotonic() - t0
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def healthy(srv: Server) -> bool:
    if srv.proc.poll() is not None:
        return False
    try:
        return http_get(srv.url, "/health", timeout=30).get("status") == "ok"
    except (OSError, ValueError):
        return False


def soak(srv: Server, jobs: list[Job], clients: int, deadline: float, check_every: int, timeout: float) -> dict:
    """Run the jobs from `clients` threads; every `check_every` requests: health and an RSS sample."""
    t0 = time.monotonic()
    samples = [{"s": 0.0, "requests": 0, "rss_mb": rss_mb(srv.proc.pid), "healthy": healthy(srv)}]
    outcomes, done, next_check = [], 0, check_every

    def run(job: Job) -> Outcome:
        if time.monotonic() > deadline:
            return Outcome(job.kind, job.requests, skipped=True)
        return execute(srv.url, job, timeout)

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(run, job) for job in jobs]
        for f in as_completed(futures):
            outcomes.append(f.result())
            done += outcomes[-1].requests if not outcomes[-1].skipped else 0
            if done >= next_check or len(outcomes) == len(jobs):
                next_check = done + check_every
                alive = healthy(srv)
                samples.append({"s": time.monotonic() - t0, "requests": done, "healthy": alive,
                                "rss_mb": rss_mb(srv.proc.pid) if srv.proc.poll() is None else float("nan")})
                print(f"  {done:4d} requests, {samples[-1]['s']:6.0f} s, RSS {samples[-1]['rss_mb']:6.0f} MB, "
                      f"{'healthy' if alive else 'NOT HEALTHY'}", flush=True)
                if not alive:
                    for g in futures:
                        g.cancel()
                    break
    return {"outcomes": outcomes, "samples": samples, "seconds": time.monotonic() - t0}


def memory(samples: list[dict], warm_after: int) -> dict:
    """First, after warm-up, max and last RSS; flat = last within 10% + 50 MB of the value after warm-up."""
    rss = [s["rss_mb"] for s in samples if not math.isnan(s["rss_mb"])] or [float("nan")]
    warm = next((s["rss_mb"] for s in samples if s["requests"] >= warm_after and not math.isnan(s["rss_mb"])), rss[-1])
    return {"first_mb": rss[0], "warm_mb": warm, "max_mb": max(rss), "last_mb": rss[-1],
            "flat": rss[-1] <= 1.1 * warm + 50}


def top1_diff(got: dict, ref: dict) -> dict:
    """Greedy text and top-1 probabilities of two answers to one request, position by position until they part."""
    dp, dlp = [], []
    for a, b in zip(got["completion_probabilities"], ref["completion_probabilities"]):
        ta, tb = a["top_logprobs"][0], b["top_logprobs"][0]
        dp.append(abs(math.exp(ta["logprob"]) - math.exp(tb["logprob"])))
        dlp.append(abs(ta["logprob"] - tb["logprob"]))
        if a["id"] != b["id"]:
            break
    return {"same_text": got["content"] == ref["content"], "max_dp": max(dp, default=0.0),
            "max_dlogprob": max(dlp, default=0.0), "got": got["content"], "ref": ref["content"]}


def compare(ref: Server, srv: Server | None, outcomes: list[Outcome], deadline: float, timeout: float) -> dict:
    """Every exact non-streaming answer of the soak again from the reference server, prompt cache off, and from the
    RidgeFill server alone (cache off, no other request running) when it is still up: where the soak's answer differs
    from the reference, `alone` tells whether the soak's conditions (cache reuse, concurrent batches) or the server
    itself made the difference."""
    rows, todo = [], [o for o in outcomes if o.answer is not None]
    for o in todo:
        if time.monotonic() > deadline:
            break
        body = {**o.body, "cache_prompt": False}
        res = http_post(ref.url, "/completion", body, timeout)
        row = top1_diff(o.answer, res) | {"prompt_chars": len(o.body["prompt"]), "timings": o.answer["timings"]}
        if srv is not None:
            alone = top1_diff(http_post(srv.url, "/completion", body, timeout), res)
            row |= {"alone_same_text": alone["same_text"], "alone_max_dp": alone["max_dp"]}
        rows.append(row)
    return {"answers": len(todo), "compared": len(rows), "text_mismatches": [r for r in rows if not r["same_text"]],
            "max_dp": max((r["max_dp"] for r in rows), default=0.0),
            "max_dlogprob": max((r["max_dlogprob"] for r in rows), default=0.0),
            "over_noise": sum(r["max_dp"] > DP_NOISE for r in rows),
            "alone_max_dp": max((r.get("alone_max_dp", 0.0) for r in rows), default=0.0),
            "alone_text_mismatches": sum(not r.get("alone_same_text", True) for r in rows), "rows": rows}


def report(result: dict) -> list[str]:
    out, mem, cmp = result["outcomes"], result["memory"], result["comparison"]
    ran = [o for o in out if not o.skipped]
    errors = Counter(f"{o.kind}: {o.error.split(':')[0]}" for o in ran if o.error)
    lines = [f"{sum(o.requests for o in ran)} requests ({len(ran)} jobs, {len(out) - len(ran)} skipped for time) in "
             f"{result['seconds']:.0f} s from {result['clients']} clients; server up throughout: "
             f"{'yes' if result['up'] else 'NO'}",
             "by kind: " + ", ".join(f"{k} {sum(o.requests for o in ran if o.kind == k)}" for k in KINDS),
             "errors: " + (", ".join(f"{k} ×{n}" for k, n in errors.most_common()) or "none")]
    lines += [f"  e.g. {o.kind}: {o.error}" for o in [o for o in ran if o.error][:3]]
    lines.append(f"RSS MB: first {mem['first_mb']:.0f}, after warm-up {mem['warm_mb']:.0f}, max {mem['max_mb']:.0f}, "
                 f"last {mem['last_mb']:.0f}: {'flat' if mem['flat'] else 'NOT flat'}")
    lines.append(f"exact answers vs the reference server (cache off, 1 slot): {cmp['compared']} of {cmp['answers']} "
                 f"compared, same text {cmp['compared'] - len(cmp['text_mismatches'])}/{cmp['compared']}, top-1 "
                 f"|Δp| max {cmp['max_dp']:.4f} ({cmp['over_noise']} over {DP_NOISE}), |Δlogprob| max "
                 f"{cmp['max_dlogprob']:.4f}")
    lines.append(f"the same requests to the soaked server alone (cache off) vs the reference: "
                 f"{cmp['alone_text_mismatches']} texts differ, top-1 |Δp| max {cmp['alone_max_dp']:.4f}")
    lines += [f"  {'TEXT DIFFERS' if not r['same_text'] else 'over noise'}: soak {r['got']!r} vs reference "
              f"{r['ref']!r} (|Δp| {r['max_dp']:.4f}; cache_n {r['timings']['cache_n']} of "
              f"{r['timings']['cache_n'] + r['timings']['prompt_n']} tokens; the server alone "
              f"{'agrees with the reference' if r.get('alone_same_text') else 'differs too'})"
              for r in cmp["rows"] if not r["same_text"] or r["max_dp"] > DP_NOISE]
    return lines


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maps", help="map file for --ridgefill-maps (required but with --plain)")
    ap.add_argument("--model", help="model GGUF (default: SmolLM2-135M, fetched)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8, help="concurrent client threads (default 8)")
    ap.add_argument("--slots", type=int, default=4, help="server slots, -np (default 4)")
    ap.add_argument("--ctx-per-slot", type=int, default=2048, help="-c is slots × this (default 2048)")
    ap.add_argument("--tail", type=int, default=128, help="--ridgefill-tail (default 128)")
    ap.add_argument("--cache-ram", type=int, default=256, help="the server's RAM prompt cache, MiB (default 256)")
    ap.add_argument("-t", "--threads", type=int, help="server threads (default: the server's)")
    ap.add_argument("--check-every", type=int, default=20, help="health and RSS every N requests (default 20)")
    ap.add_argument("--warm-up", type=int, default=40, help="RSS is judged against its value after this many "
                    "requests (default 40; the RAM prompt cache and the KV cache's pages fill up first)")
    ap.add_argument("--max-minutes", type=float, default=60, help="stop starting requests after this (default 60)")
    ap.add_argument("--timeout", type=float, default=600, help="per request, seconds (default 600)")
    ap.add_argument("--exact-traffic", action="store_true",
                    help="the control run: every request exact, so differences come from concurrency alone")
    ap.add_argument("--plain", action="store_true", help="with --exact-traffic: soak a server without RidgeFill "
                    "(same slots, unified KV cache), the upstream baseline of that control")
    ap.add_argument("--dp-fail", type=float, default=DP_FAIL,
                    help=f"fail when an exact answer's top-1 probability moved more than this (default {DP_FAIL})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the result as JSON")
    args = ap.parse_args()
    if args.plain and not args.exact_traffic:
        ap.error("--plain needs --exact-traffic (a server without RidgeFill refuses approximate requests)")
    if not args.maps and not args.plain:
        ap.error("--maps MAPS.gguf is required")
    return args


def main() -> None:
    args = parse_args()
    model = Path(args.model) if args.model else models.fetch("smollm2-135m")
    deadline = time.monotonic() + 60 * args.max_minutes
    threads = ["-t", str(args.threads)] if args.threads else []
    jobs = plan(Prose(model), args.requests, random.Random(args.seed), args.exact_traffic)
    print(f"soak: {sum(j.requests for j in jobs)} requests in {len(jobs)} jobs, {args.clients} clients, "
          f"{args.slots} slots", flush=True)
    ridgefill = ["-kvu"] if args.plain else ["--ridgefill-maps", args.maps, "--ridgefill-tail", str(args.tail)]
    with Server(model, "-c", str(args.slots * args.ctx_per_slot), "-np", str(args.slots), *threads,
                "-cram", str(args.cache_ram), *ridgefill) as srv:
        result = soak(srv, jobs, args.clients, deadline, args.check_every, args.timeout)
        result["up"] = all(s["healthy"] for s in result["samples"]) and healthy(srv)
        if not result["up"]:
            print(f"the server died; its log ends:\n{srv.log()[-3000:]}", file=sys.stderr)
        result["memory"] = memory(result["samples"], warm_after=args.warm_up)
        print("reference: exact answers again from a server without RidgeFill", flush=True)
        with Server(model, "-c", "4096", "-np", "1", *threads) as ref:
            result["comparison"] = compare(ref, srv if result["up"] else None, result["outcomes"], deadline,
                                           args.timeout)
    result.update(clients=args.clients, config=vars(args) | {"model": str(model), "json": str(args.json)})
    lines = report(result)
    failed = (not result["up"] or any(o.error for o in result["outcomes"]) or not result["memory"]["flat"]
              or result["comparison"]["max_dp"] > args.dp_fail)
    lines.append("verdict: " + ("FAILED" if failed else "ok"))
    print("\n".join(lines))
    if args.json:
        out = {**result, "outcomes": [asdict(o) | {"body": None, "answer": None} for o in result["outcomes"]],
               "summary": lines}
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
