#!/usr/bin/env python3
"""Which loads a kernel issues before its griddepcontrol.wait, from `cuobjdump -sass` on stdin.

A kernel that reads before its pdl_wait() (src/backend/cuda/kernels/common.cuh, "// pdl_wait later") may
load only what no kernel of the step writes (weights) there. ptxas schedules the SASS, and it may put an
ld.global.nc (LDG...CONSTANT, from __ldg) above the wait (ACQBULK): ld.global.nc promises data no grid writes
while this one runs (stop 45: a mixed Q/K/V mat-vec's activation loads, its logits moving run to run under
PDL). This lists, per kernel whose name matches the filter (argv[1], a regular expression; default: every
kernel with a wait after a load), the loads before the first ACQBULK in program order: non-coherent
(CONSTANT) and coherent ones, and those between each wait and the one before (a flag-dependent first wait,
as the float mat-vec's, puts the weights before a later one). Reading which of them are weights is the
reader's job (their count against the kernel's first-step weight loads); a load of what an earlier kernel
writes must be a coherent one after the wait (ld_act).

  cuobjdump -sass build/bin/libloom_cuda.so | tools/sass_wait.py 'mat_vec_direct'
  scripts/sass-local.sh src/backend/cuda/kernels/mat_vec_fast.cu /tmp/mv.sass && tools/sass_wait.py < /tmp/mv.sass
"""
import re
import sys

pattern = re.compile(sys.argv[1]) if len(sys.argv) > 1 else None
demangled = re.compile(r'_GLOBAL__N__[0-9a-f]+_\d+_[a-z_]+_cu_[0-9a-f]+\d+')
name, lines = None, []


def report():
    if name is None or (pattern and not pattern.search(name)):
        return
    # the loads between consecutive waits (program order), as (non-coherent, coherent): a kernel whose first
    # wait depends on a flag (the float mat-vec's `early`: a wait at the top when off, after the first
    # weights when on) shows its first wait with none before it, and the weights before a later one
    segments, nc, co = [], 0, 0
    for line in lines:
        if 'ACQBULK' in line:
            segments.append((nc, co))
            nc = co = 0
        elif re.search(r'\bLDG\b|\bLDG\.', line):
            nc += 'CONSTANT' in line
            co += 'CONSTANT' not in line
    if not segments or (not pattern and not any(n + c for n, c in segments)):
        return
    print(f'{demangled.sub("", name)[:110]}: before the first wait {segments[0][0]} non-coherent, '
          f'{segments[0][1]} coherent loads; waits {len(segments)}; non-coherent/coherent loads before each wait '
          f'since the one before: {" ".join(f"{n}/{c}" for n, c in segments)}')

for line in sys.stdin:
    if 'Function :' in line:  # cuobjdump -sass
        report()
        name, lines = line.split('Function :', 1)[1].strip(), []
    elif line.startswith('.text.') and line.rstrip().endswith(':'):  # nvdisasm -c (scripts/sass-local.sh)
        report()
        name, lines = line.strip()[len('.text.'):-1], []
    else:
        lines.append(line)
report()
