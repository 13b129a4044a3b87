import sys
def load(f):
    d = {}
    for l in open(f):
        c = [x.strip() for x in l.split("|")]
        if len(c) > 6 and c[1] and c[1] not in ("case",) and not c[1].startswith("---"):
            d[c[1]] = (c[2], float(c[3]), c[4], float(c[5]), float(c[6].split()[0]))
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
import math
print(f"case | before chosen ms ratio | after chosen ms ratio")
ga = gb = 0
for k in b:
    x, y = a.get(k), b[k]
    if x is None: continue
    ga += math.log(x[4]); gb += math.log(y[4])
    if max(x[4], y[4]) > 1.2 or x[0] != y[0]:
        print(f"  {k:28s} {x[0]:8s} {x[1]:.3f} {x[4]:.2f} | {y[0]:8s} {y[1]:.3f} {y[4]:.2f}")
n = len(b)
print(f"geomean chosen/best: before {math.exp(ga/n):.3f} after {math.exp(gb/n):.3f}; max before {max(v[4] for v in a.values()):.2f} after {max(v[4] for v in b.values()):.2f}")
