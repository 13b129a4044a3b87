"""torch's own op database (OpInfo, ~580 ops with sample inputs) on a sparse first input, via
``benchmarks/report_opinfo.py``: no op gives a different result from dense torch, none raises
where dense torch does not except the in-place fills that would write outside the pattern, and
the ops left on the dense fallback are exactly the listed ones (windowed ops, ``as_strided``,
torch internals). A new fallback, error or mismatch fails here, named."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from report_opinfo import survey  # noqa: E402

#: in-place random fills and resizes: they would write every position (a sparse tensor's
#: in-place ops keep its pattern), so they refuse, naming the op
REFUSED = {"cauchy", "exponential", "geometric",
           "log_normal", "normal.in_place", "resize_", "resize_as_", "uniform"}
#: still on the dense fallback (docs/ops.md), for some or all of their samples: max pooling
#: with indices (adaptive too),
#: anti-aliased interpolation, grid sampling, negative non-constant pads, ``index_reduce``,
#: ``as_strided`` (no meaning for sparse storage) and torch internals
FALLBACK = {
    "_segment_reduce.lengths", "_segment_reduce.offsets", "_unsafe_masked_index",
    "_unsafe_masked_index_put_accumulate", "as_strided", "as_strided.partial_views",
    "as_strided_copy", "as_strided_scatter",
    "native_dropout_backward",
    "torch.ops.aten._safe_softmax.default",
    # batch norm's ATen forms update the dense running statistics in place: since session 30
    # an in-place op that writes only dense tensors runs densified (it was refused before);
    # ``F.batch_norm`` itself is dense by nature (``dense_by_nature``)
    "_batch_norm_with_update", "_native_batch_norm_legit",
}


def test_torchs_op_database_on_sparse_inputs():
    outcome = survey()
    mismatch = sorted(n for n, (seen, _, _) in outcome.items() if seen["mismatch"])
    errors = {n: sorted(err) for n, (seen, _, err) in outcome.items() if seen["error"] and n not in REFUSED}
    fallback = {n: sorted(fb) for n, (seen, fb, _) in outcome.items()
                if seen["fallback"] and not seen["mismatch"] and not seen["error"]}
    assert not mismatch, f"results that differ from dense torch: {mismatch}"
    assert not errors, f"errors where dense torch has none: {errors}"
    new = {n: fb for n, fb in fallback.items() if n not in FALLBACK}
    assert not new, f"ops newly on the dense fallback (ATen ops that took it): {new}"
    ok = sum(1 for seen, _, _ in outcome.values() if set(seen) <= {"ok", "random", "sparse meaning"})
    assert ok >= 560, f"only {ok} of {len(outcome)} ops run without the fallback"
