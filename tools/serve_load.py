#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (`loom serve`, llama-server, ...): N concurrent
streaming clients on fixed prompts, then a report of requests/s, generated tokens/s, time to first
token and inter-token latency (p50/p99), errors, and with --check whether every response equals the
same request run alone (no cross-talk; batch invariance under greedy decoding or fixed seeds).

Python's standard library only (http.client, threads in several processes), so it runs wherever python3 does.

  serve_load.py --url http://127.0.0.1:8080 -c 64 -n 256 --max-tokens 64 [--chat] [--check] [--json]
  serve_load.py -c 64 -n 64 --prompt-tokens 256 --max-tokens 256 --ignore-eos   # fixed lengths
  serve_load.py -c 64 --soak 600 --server-pid PID --max-growth-pct 5   # a soak: memory must stay flat

Throughput: generated_tokens_per_s is every generated token over the wall time (prompts included);
decode_tokens_per_s is the mean request's rate from its first token to its last times the concurrency
(with -n equal to -c: the sum of the streams' rates); steady_tokens_per_s
counts the tokens of all streams between the moment every stream has its first token and the moment
the first one ends, over that time: every stream decoding, no prompt in flight (what a batched
benchmark's generation figure, `loom bench -npl`'s S_TG, measures; with -n equal to -c).
"""
import argparse
import http.client
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "To be, or not to be, that is the question:",
    "Now is the winter of our discontent",
    "All the world's a stage, and all the men and women merely players;",
    "What light through yonder window breaks?",
    "Friends, Romans, countrymen, lend me your ears;",
    "The quality of mercy is not strained;",
    "If music be the food of love, play on;",
    "Once more unto the breach, dear friends, once more;",
]


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


class Result:
    def __init__(self, index):
        self.index = index
        self.text = ""
        self.tokens = 0          # generated tokens (usage), else content chunks
        self.ttft = None         # seconds from sending to the first content chunk
        self.gaps = []           # seconds between content chunks
        self.times = []          # perf_counter of each content chunk
        self.error = None
        self.seconds = 0.0


def token_prompts(args, n_tokens):
    """Prompts of exactly n_tokens token ids (one per PROMPTS entry): each text, then the others as
    filler, tokenized by the server's /tokenize (loom serve and llama-server both have it)."""
    url = urllib.parse.urlparse(args.url)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    out = []
    for i, text in enumerate(PROMPTS):
        filler = " ".join(PROMPTS[i + 1:] + PROMPTS[:i])
        while True:
            conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=args.timeout)
            conn.request("POST", "/tokenize", json.dumps({"content": text + " " + filler, "add_special": True}),
                         headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"/tokenize: HTTP {resp.status}: {resp.read(300).decode(errors='replace')}")
            tokens = [t["id"] if isinstance(t, dict) else t for t in json.loads(resp.read())["tokens"]]
            conn.close()
            if len(tokens) >= n_tokens:
                out.append(tokens[:n_tokens])
                break
            filler = filler + " " + filler
    return out


def request_body(args, index):
    prompt = PROMPTS[index % len(PROMPTS)]
    if args.token_prompts:
        prompt = args.token_prompts[index % len(PROMPTS)]
    body = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed + index % len(PROMPTS),
            "stream": True, "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.model:
        body["model"] = args.model
    if args.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def run_one(args, index):
    """One streaming request; returns a Result (error set on any failure, never raises)."""
    r = Result(index)
    url = urllib.parse.urlparse(args.url)
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    t0 = time.perf_counter()
    last = None
    try:
        conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=args.timeout)
        conn.request("POST", path, json.dumps(request_body(args, index)), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
            return r
        chunks = 0
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            msg = json.loads(data)
            if "error" in msg:
                r.error = f"stream error: {msg['error']}"
                break
            if msg.get("usage"):
                r.tokens = int(msg["usage"].get("completion_tokens", 0))
            for choice in msg.get("choices", []):
                piece = choice.get("delta", {}).get("content") if args.chat else choice.get("text")
                # a chunk per generated token (loom serve sends one even when the token's text is
                # held back); the role and finish chunks carry no token
                if piece is not None and not choice.get("finish_reason") and (piece or not args.chat or
                                                                              "role" not in choice.get("delta", {})):
                    now = time.perf_counter()
                    if r.ttft is None:
                        r.ttft = now - t0
                    else:
                        r.gaps.append(now - last)
                    last = now
                    r.times.append(now)
                    r.text += piece
                    chunks += 1
        if r.tokens == 0:
            r.tokens = chunks
        conn.close()
    except Exception as e:  # the report counts it; a load generator must not stop on one failure
        r.error = f"{type(e).__name__}: {e}"
    r.seconds = time.perf_counter() - t0
    return r


def client_threads(args, concurrency, n_requests, deadline, part, parts):
    """`concurrency` threads sending requests part, part + parts, ... back to back until n_requests
    are taken or the deadline (perf_counter; 0: none) passes. Returns {index: Result}."""
    results = {}
    next_index = [part]
    lock = threading.Lock()

    def worker():
        while not deadline or time.perf_counter() < deadline:
            with lock:
                i = next_index[0]
                if n_requests is not None and i >= n_requests:
                    return
                next_index[0] += parts
            r = run_one(args, i)
            with lock:
                results[i] = r

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def client_process(job):
    args, concurrency, n_requests, deadline, part, parts = job
    return client_threads(args, concurrency, n_requests, deadline, part, parts)


def run_clients(args, concurrency, n_requests=None, seconds=0.0):
    """`concurrency` clients send requests back to back: request i for i = 0, 1, ... until n_requests
    are taken or, with `seconds` (a soak), until that much time has passed. Returns the results in
    request order and the wall time. The clients are threads of --processes processes: in one
    process, 64 streams' reads wait for each other's turn at Python's interpreter lock, which adds
    milliseconds to the inter-token times measured (perf_counter is CLOCK_MONOTONIC, one clock for
    every process)."""
    t0 = time.perf_counter()
    deadline = t0 + seconds if seconds else 0.0
    parts = args.processes if args.processes > 0 else min(8, max(1, (os.cpu_count() or 1) // 2))
    # a divisor of the concurrency: every process as many threads, so none finishes its share late
    parts = max(p for p in range(1, max(1, min(parts, concurrency)) + 1) if concurrency % p == 0)
    if parts == 1:
        results = client_threads(args, concurrency, n_requests, deadline, 0, 1)
    else:
        jobs = [(args, concurrency // parts, n_requests, deadline, p, parts) for p in range(parts)]
        # spawned, not forked: the memory sampler's thread may be running (--soak)
        with multiprocessing.get_context("spawn").Pool(parts) as pool:
            results = {}
            for got in pool.map(client_process, jobs):
                results.update(got)
    return [results[i] for i in sorted(results)], time.perf_counter() - t0


def rss_mb(pid):
    """Resident set of process `pid` in MB (Linux /proc), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def gpu_mb(pid):
    """Device memory process `pid` holds (nvidia-smi), or None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return None


class MemorySampler:
    """Samples the server's host (and device) memory every `period` seconds in a thread."""

    def __init__(self, pid, period):
        self.pid, self.period, self.samples = pid, period, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        t0 = time.perf_counter()
        while True:
            self.samples.append((time.perf_counter() - t0, rss_mb(self.pid), gpu_mb(self.pid)))
            if self.stop.wait(self.period):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def growth(self, warmup_fraction=0.25):
        """(first, last, growth %) of host and device memory after the warm-up part of the samples."""
        def of(k):
            vals = [smp[k] for smp in self.samples if smp[k] is not None]
            if len(vals) < 2:
                return None, None, None
            first = vals[min(len(vals) - 1, int(len(vals) * warmup_fraction))]
            last = vals[-1]
            return first, last, (100.0 * (last - first) / first if first else 0.0)
        return of(1), of(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("-c", "--concurrency", type=int, default=8, help="concurrent streaming clients")
    ap.add_argument("-n", "--requests", type=int, default=32, help="requests in all")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chat", action="store_true", help="/v1/chat/completions (default /v1/completions)")
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--processes", type=int, default=0,
                    help="client processes (threads split among them; 0: min(8, cores / 2))")
    ap.add_argument("--check", action="store_true",
                    help="first run each distinct request alone, then require every concurrent response to equal it")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="prompts of exactly this many tokens, sent as token ids (completions only)")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="ask the server to go on past end-of-generation tokens (ignore_eos), so every request "
                         "generates --max-tokens")
    ap.add_argument("--soak", type=float, default=0.0,
                    help="instead of -n requests: clients send requests back to back for this many seconds")
    ap.add_argument("--server-pid", type=int, default=0,
                    help="sample this process's host memory (and device memory, with nvidia-smi) during the run")
    ap.add_argument("--max-growth-pct", type=float, default=-1.0,
                    help="fail when host or device memory grows by more than this after the first quarter of the run")
    args = ap.parse_args()
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("-c, -n and --max-tokens must be at least 1")
    if args.prompt_tokens and args.chat:
        ap.error("--prompt-tokens needs completions (not --chat)")
    args.token_prompts = token_prompts(args, args.prompt_tokens) if args.prompt_tokens > 0 else None

    alone = {}
    if args.check:
        for i in range(min(args.requests, len(PROMPTS))):
            r = run_one(args, i)
            if r.error:
                print(f"serve_load: request {i} alone failed: {r.error}", file=sys.stderr)
                return 1
            alone[i % len(PROMPTS)] = r.text

    period = max(0.5, args.soak / 40) if args.soak > 0 else 1.0
    sampler = MemorySampler(args.server_pid, period) if args.server_pid else None
    if sampler:
        sampler.__enter__()
    try:
        if args.soak > 0:
            results, wall = run_clients(args, args.concurrency, seconds=args.soak)
            args.requests = len(results)
        else:
            results, wall = run_clients(args, args.concurrency, n_requests=args.requests)
    finally:
        if sampler:
            sampler.__exit__()
    errors = [r for r in results if r.error]
    ok = [r for r in results if not r.error]
    mismatches = [r for r in ok if args.check and r.text != alone.get(r.index % len(PROMPTS))]
    tokens = sum(r.tokens for r in ok)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    rates = [len(r.gaps) / sum(r.gaps) for r in ok if r.gaps and sum(r.gaps) > 0]
    decode_rate = sum(rates) / len(rates) * min(args.concurrency, len(rates)) if rates else 0.0
    steady_rate = float("nan")
    timed = [r for r in ok if r.times]
    if timed:
        start = max(r.times[0] for r in timed)
        end = min(r.times[-1] for r in timed)
        if end > start:
            steady_rate = sum(1 for r in timed for t in r.times if start < t <= end) / (end - start)
    report = {
        "url": args.url, "concurrency": args.concurrency, "requests": args.requests, "max_tokens": args.max_tokens,
        "seconds": wall, "requests_per_s": len(ok) / wall, "generated_tokens": tokens,
        "generated_tokens_per_s": tokens / wall, "decode_tokens_per_s": decode_rate,
        "steady_tokens_per_s": steady_rate,
        "prompt_tokens": args.prompt_tokens or None,
        "ttft_ms_p50": percentile(ttft, 0.5) * 1e3, "ttft_ms_p99": percentile(ttft, 0.99) * 1e3,
        "itl_ms_p50": percentile(gaps, 0.5) * 1e3, "itl_ms_p99": percentile(gaps, 0.99) * 1e3,
        "errors": len(errors), "checked": args.check, "mismatches": len(mismatches),
    }
    grew = False
    if sampler:
        (h0, h1, hg), (d0, d1, dg) = sampler.growth()
        report.update({"host_mb_first": h0, "host_mb_last": h1, "host_growth_pct": hg,
                       "device_mb_first": d0, "device_mb_last": d1, "device_growth_pct": dg,
                       "memory_samples": len(sampler.samples)})
        if args.max_growth_pct >= 0:
            grew = any(g is not None and g > args.max_growth_pct for g in (hg, dg))
    if args.json:
        print(json.dumps(report))
    else:
        print(f"serve_load: {args.requests} requests, {args.concurrency} concurrent, max_tokens {args.max_tokens}: "
              f"{wall:.2f} s, {report['requests_per_s']:.2f} req/s, {tokens} tokens, "
              f"{report['generated_tokens_per_s']:.1f} tok/s, decode {decode_rate:.1f} tok/s, "
              f"steady {steady_rate:.1f} tok/s")
        print(f"serve_load: time to first token p50 {report['ttft_ms_p50']:.1f} ms, p99 {report['ttft_ms_p99']:.1f} ms; "
              f"inter-token p50 {report['itl_ms_p50']:.1f} ms, p99 {report['itl_ms_p99']:.1f} ms")
        print(f"serve_load: {len(errors)} errors" +
              (f", {len(mismatches)} responses differ from the same request alone" if args.check else ""))
        if sampler:
            print(f"serve_load: server memory after the first quarter -> end: host {report['host_mb_first']} -> "
                  f"{report['host_mb_last']} MB ({report['host_growth_pct']}%), device {report['device_mb_first']} -> "
                  f"{report['device_mb_last']} MB ({report['device_growth_pct']}%)")
    for r in errors[:5]:
        print(f"serve_load: request {r.index}: {r.error}", file=sys.stderr)
    for r in mismatches[:5]:
        print(f"serve_load: request {r.index} differs from alone: {r.text[:80]!r} vs "
              f"{alone.get(r.index % len(PROMPTS), '')[:80]!r}", file=sys.stderr)
    if grew:
        print(f"serve_load: server memory grew by more than {args.max_growth_pct}%", file=sys.stderr)
    return 1 if errors or mismatches or grew else 0


if __name__ == "__main__":
    sys.exit(main())
