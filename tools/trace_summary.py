#!/usr/bin/env python3
"""Summarizes a `loom run --trace FILE` Chrome trace: per dispatch kind (and anchor shape/type), the count,
total and mean GPU microseconds, sorted by total. Dispatches were timed one at a time with events, so the
sum is a serialized upper bound of the step's GPU time (and, launched eagerly, it includes each launch's
host work: a slow host path shows up here and not in a replayed graph).
  usage: trace_summary.py TRACE.json [--by-shape]"""
import json
import signal
import sys
from collections import defaultdict

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    by_shape = "--by-shape" in sys.argv[2:]
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    groups = defaultdict(lambda: [0, 0.0])
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        key = e.get("cat", e["name"])
        if by_shape:
            key += f" {e['args'].get('type', '')}{e['args'].get('shape', '')}"
        groups[key][0] += 1
        groups[key][1] += e["dur"]
    total = sum(g[1] for g in groups.values())
    n = sum(g[0] for g in groups.values())
    print(f"{'dispatch':<56} {'count':>5} {'total us':>9} {'mean us':>8} {'share':>6}")
    for key, (count, us) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{key:<56} {count:>5} {us:>9.1f} {us / count:>8.2f} {100 * us / total:>5.1f}%")
    print(f"{'total':<56} {n:>5} {total:>9.1f}")


if __name__ == "__main__":
    main()
