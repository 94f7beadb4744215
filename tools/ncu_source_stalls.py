#!/usr/bin/env python3
# Top stall lines of an ncu source-page CSV (ncu --page source --print-source sass --csv ... > FILE):
#   ncu_source_stalls.py FILE [N]
import csv,os,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=next(i for i,r in enumerate(rows) if 'Source' in r and any('Sampling' in c for c in r))
h=rows[hdr]; si=h.index('Source'); wi=[i for i,c in enumerate(h) if 'Warp Stall Sampling (All' in c][0]
data=[]
for r in rows[hdr+1:]:
    if len(r)>wi:
        try: data.append((float(r[wi] or 0), r[si]))
        except: pass
tot=sum(d[0] for d in data); print("total samples", tot)
for v,src in sorted(data,reverse=True)[:int(sys.argv[2]) if len(sys.argv)>2 else 16]: print(f"{100*v/tot:5.1f}% {src[:110]}")
