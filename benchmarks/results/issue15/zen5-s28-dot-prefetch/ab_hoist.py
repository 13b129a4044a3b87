"""A/B (``ab_variants``): the dot prefetch's set-up per row (as before) against once per chunk (``Nest.setup``).
    SCORCH_DATA_DIR=../shared/data python ab_hoist.py --rounds 5 --cases spmm:4elt:32 ..."""
import sys
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab_variants as AB
L = AB.LOOPS
new = L._dot_prefetch


def per_row(n, lp, lv, st):
    before = len(n.setup)
    setup_done, body = new(n, lp, lv, st)
    moved = n.setup[before:]
    del n.setup[before:]
    return moved, body


AB.F.per_row, AB.F.hoisted = per_row, new
sys.argv += ["--variants", "per_row:_dot_prefetch=F.per_row", "hoisted:_dot_prefetch=F.hoisted"]
AB.main()
