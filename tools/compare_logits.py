#!/usr/bin/env python3
"""NMSE between two float32 logits files (e.g. `loom run --dump-logits` on CUDA and on the CPU).

    python3 tools/compare_logits.py A.bin B.bin [--threshold 1e-4]   # B is the reference

Exit code 0 when sum((a-b)^2)/sum(b^2) <= threshold and A is finite.
"""
import argparse
import sys

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--threshold", type=float, default=1e-4)
ap.add_argument("--label", default="")
args = ap.parse_args()
a = np.fromfile(args.a, dtype=np.float32).astype(np.float64)
b = np.fromfile(args.b, dtype=np.float32).astype(np.float64)
if a.size != b.size or a.size == 0:
    sys.exit(f"compare_logits: sizes differ ({a.size} vs {b.size})")
nmse = float(((a - b) ** 2).sum() / (b ** 2).sum())
ok = nmse <= args.threshold and bool(np.isfinite(a).all())
print(f"compare_logits: {args.label} NMSE={nmse:.3e} (threshold {args.threshold:.0e}) -> {'OK' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
