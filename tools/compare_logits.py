#!/usr/bin/env python3
"""NMSE between two float32 logits files (e.g. `loom run --dump-logits` on CUDA and on the CPU).

    python3 tools/compare_logits.py A.bin B.bin [--threshold 1e-4] [--vocab N]   # B is the reference

With --vocab N (the rows' length) it also prints each position's NMSE and the share of positions whose
argmax agrees, to tell a drift from a jump at one position (a flipped MoE route, a flipped code).

Exit code 0 when sum((a-b)^2)/sum(b^2) <= threshold and A is finite.
"""
import argparse
import os
import sys

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--threshold", type=float, default=1e-4)
ap.add_argument("--label", default="")
ap.add_argument("--vocab", type=int, default=0, help="row length: print per-position NMSE and argmax agreement")
args = ap.parse_args()
for path in (args.a, args.b):
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        sys.exit(f"compare_logits: {path} is missing or empty")
a = np.memmap(args.a, dtype=np.float32, mode="r")
b = np.memmap(args.b, dtype=np.float32, mode="r")
if a.size != b.size:
    sys.exit(f"compare_logits: sizes differ ({a.size} vs {b.size})")
a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
nmse = float(((a - b) ** 2).sum() / (b ** 2).sum())
ok = nmse <= args.threshold and bool(np.isfinite(a).all())
if args.vocab > 0 and a.size % args.vocab == 0:
    ra, rb = a.reshape(-1, args.vocab), b.reshape(-1, args.vocab)
    per = ((ra - rb) ** 2).sum(axis=1) / np.maximum((rb ** 2).sum(axis=1), 1e-300)
    agree = float((ra.argmax(axis=1) == rb.argmax(axis=1)).mean())
    print(f"compare_logits: {args.label} per position: " + " ".join(f"{v:.1e}" for v in per) +
          f"; argmax agreement {agree:.3f}")
print(f"compare_logits: {args.label} NMSE={nmse:.3e} (threshold {args.threshold:.0e}) -> {'OK' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
