"""In-process A/B (``ab_variants``): the dot / register-row kernels with and without the
extra prefetch of each gathered row's last cache line where the rows do not start on a line
(``loops._dot_distance``'s ``pfm``). The benchmark's dense operands come from numpy and start
16 bytes past a line, so every case here runs the misaligned path.

    SCORCH_DATA_DIR=../shared/data python ab_last_line.py [--threads N] --cases ..."""
import sys
import ab_variants as AB

original = AB.LOOPS._dot_gather_rows


def without_last(n, lp, st, entry, last=False):
    return [] if last else original(n, lp, st, entry)


AB.F.without_last = without_last     # so that ``patched`` (which reads F first) finds it
sys.argv += ["--variants", "without:_dot_gather_rows=F.without_last", "with:_dot_gather_rows=F.without_last.__wrapped__"]
without_last.__wrapped__ = original
AB.__dict__["F"] = AB.F
if __name__ == "__main__":
    AB.main()
