#!/usr/bin/env python3
# One decode step's kernels from an ncu CSV (ncu --csv --page raw --graph-profiling node --metrics
# gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum ... > FILE): the kernels between the
# last two launches of the run's last kernel (the step's sampling), or with --first NAME those from the
# second-to-last launch of a kernel whose name starts with NAME up to the last one (a step's first kernel,
# e.g. get_rows_kernel for the embedding: a batched bench's steps end in kernels a step also runs inside),
# grouped by name and grid, with time, DRAM bytes and bandwidth against PEAK_GBS:
#   ncu_step.py FILE [PEAK_GBS] [STEP_US] [--first NAME]
import collections, csv, signal, sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # output cut by head

first = None
if "--first" in sys.argv:
    i = sys.argv.index("--first")
    first = sys.argv[i + 1]
    del sys.argv[i:i + 2]
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[2:]
col = {k: head.index(k) for k in ("Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum",
                                   "dram__bytes_read.sum", "dram__bytes_write.sum")}
def num(r, k):
    return float(r[col[k]].replace(",", "") or 0)
def short(r):  # the kernel's name without a return type, a namespace or its arguments
    return r[col["Kernel Name"]].split("(")[0].split()[-1].split("::")[-1]
if first:
    starts = [i for i, r in enumerate(rows) if short(r).startswith(first)]
    if len(starts) < 2:
        sys.exit(f"ncu_step: fewer than two steps starting with {first}")
    step = rows[starts[-2]:starts[-1]]
else:
    last = rows[-1][col["Kernel Name"]]
    ends = [i for i, r in enumerate(rows) if r[col["Kernel Name"]] == last]
    if len(ends) < 2:
        sys.exit(f"ncu_step: fewer than two steps ending in {last[:60]}")
    step = rows[ends[-2] + 1:ends[-1] + 1]
peak = float(sys.argv[2]) if len(sys.argv) > 2 else 3350.0
groups = collections.OrderedDict()
for r in step:
    key = (r[col["Kernel Name"]].split("(")[0][:58], r[col["Grid Size"]], r[col["Block Size"]])
    g = groups.setdefault(key, [0, 0.0, 0.0])
    g[0] += 1
    g[1] += num(r, "gpu__time_duration.sum") / 1000.0  # ns -> us
    g[2] += (num(r, "dram__bytes_read.sum") + num(r, "dram__bytes_write.sum")) / 1e6
total_us = sum(g[1] for g in groups.values())
total_mb = sum(g[2] for g in groups.values())
print(f"step: {len(step)} kernels, {total_us:.1f} us of kernel time, {total_mb:.1f} MB DRAM"
      f" ({total_mb / total_us * 1e3:.0f} GB/s over kernel time; floor at {peak:.0f} GB/s:"
      f" {total_mb / peak * 1e3:.1f} us)")
if len(sys.argv) > 3:
    print(f"measured step {float(sys.argv[3]):.1f} us: kernels {100 * total_us / float(sys.argv[3]):.0f}% of it")
print(f"{'kernel':58} {'grid':>14} {'block':>12} {'n':>4} {'us total':>9} {'us each':>8} {'MB':>8} {'GB/s':>6} {'%peak':>5} {'%step':>5}")
for (name, grid, block), (n, us, mb) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
    gbs = mb / us * 1e3 if us else 0
    print(f"{name:58} {grid:>14} {block:>12} {n:4d} {us:9.1f} {us / n:8.2f} {mb:8.1f} {gbs:6.0f} {100 * gbs / peak:5.0f} {100 * us / total_us:5.1f}")
