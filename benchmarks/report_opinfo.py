"""Every op of torch's own test database (OpInfo, ``op_db``: ~700 ops with sample inputs) run
with its first tensor input made sparse: which ops have a sparse path, which take the dense
fallback, which raise where dense torch does not, and which give a different result. This is
the wide survey; ``report_fallbacks.py`` is the short, hand-picked one.

For each op (float64, up to ``--samples`` samples): half of the input's entries are zeroed,
the dense op runs on that, then the same op on a scorch COO tensor of it. Each sample is one
of: ``ok`` (no fallback warning, the same result as dense torch, a sparse result counted
apart), ``fallback`` (the result is right, but through the dense fallback, named by the ATen
op that took it), ``error`` (scorch raised where dense torch did not), ``mismatch``. Results
torch defines loosely are compared for what is defined: the indices of ``kthvalue``/``topk``-like
results must point at the returned values (ties may differ), random and uninitialised results
are not compared, and ops whose sparse meaning differs from the dense one by design (softmax
over the stored entries, as torch.sparse) are listed apart.

    pip install expecttest          # torch's test utilities import it
    python benchmarks/report_opinfo.py [--out benchmarks/results/opinfo.md] [op names ...]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import math
import random
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import scorch  # noqa: E402
from scorch import _dispatch  # noqa: E402

#: ops whose result is random or uninitialised: run, not compared
RANDOM = ("bernoulli", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
          "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
          "new_empty", "new_empty_strided", "empty_like", "normal", "multinomial", "uniform", "cauchy",
          "exponential", "geometric", "log_normal", "randint_like", "rand_like", "randn_like",
          "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "empty",
          "linalg.lstsq")
#: ops whose sparse meaning is torch.sparse's, not dense torch's (docs/ops.md)
SPARSE_MEANING = ("softmax", "log_softmax", "nn.functional.softmin", "masked.softmax",
                  "masked.log_softmax", "masked.softmin", "_softmax_backward_data", "to_sparse")


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout()


def _dense(r):
    if isinstance(r, scorch.SparseTensor):
        return r.to_dense()
    if isinstance(r, torch.Tensor) and r.layout != torch.strided:
        return r.to_dense()
    if isinstance(r, (tuple, list)):
        return tuple(_dense(v) for v in r)
    return r


def _close(a, b) -> bool:
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        try:
            torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-6, atol=1e-8)
            return True
        except AssertionError:
            return False
    if isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, float) and math.isnan(a)
    return a == b


def _indices_point_at_values(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor) -> bool:
    """Some dim ``d`` of ``x`` where ``x.gather(d, indices)`` gives ``values`` (a reduced dim
    put back first)."""
    for d in range(x.dim()):
        idx, val = indices, values
        if idx.dim() == x.dim() - 1:
            idx, val = idx.unsqueeze(d), val.unsqueeze(d)
        try:
            if _close(torch.gather(x, d, idx), val):
                return True
        except RuntimeError:
            continue
    return False


def _same(got, want, x) -> bool:
    """``got`` (scorch) against ``want`` (dense torch); a (values, indices) pair may pick
    another index among equal values (torch leaves ties open), so its indices need only point
    at its values."""
    pair = isinstance(want, tuple) and hasattr(want, "indices") and len(want) == 2
    got, want = _dense(got), _dense(want)
    if pair and isinstance(want[1], torch.Tensor) and want[1].dtype == torch.int64:
        return (_close(got[0], want[0]) and got[1].shape == want[1].shape
                and (_close(got[1], want[1]) or _indices_point_at_values(x, got[0], got[1])))
    return _close(got, want)


def _sparsify(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.where(torch.rand(x.shape, generator=g) < 0.5, torch.zeros((), dtype=x.dtype), x)


@contextlib.contextmanager
def _lean_sample_inputs():
    """torch's sample iterators, without the bookkeeping meant for its unittest classes:
    each sample looks for the running ``unittest.TestCase`` with ``inspect.stack()`` (None
    here, as outside such a class) and reseeds every device's generator, which records a
    stack trace for each lazy CUDA / XPU / MTIA call. Under pytest (a deep stack) that took
    79 of the survey test's 107 s. Here the lookup answers None at once and the reseeding
    covers the CPU's generators (torch, ``random``, numpy): the same samples, the same seed
    (all 584 verdicts unchanged)."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    def cpu_seed(seed=None):
        seed = common_utils.SEED if seed is None else seed
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)

    saved = common_utils.extract_test_fn, core.extract_test_fn, common_utils.set_rng_seed
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
    common_utils.set_rng_seed = cpu_seed
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn, common_utils.set_rng_seed = saved


def survey(names=(), samples: int = 4, timeout: int = 20):
    with _lean_sample_inputs():
        return _survey(names, samples, timeout)


def _survey(names, samples: int, timeout: int):
    from torch.testing._internal.common_methods_invocations import op_db
    torch.manual_seed(0)                 # the samples' values (make_tensor draws from torch's RNG)
    signal.signal(signal.SIGALRM, _alarm)
    outcome = {}
    for op in op_db:
        full = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if names and full not in names and op.name not in names:
            continue
        try:
            if torch.float64 not in op.supported_dtypes("cpu"):
                continue
            inputs = list(itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=False),
                                           samples))
        except Exception:   # noqa: BLE001  (an op whose samples cannot be made here)
            continue
        g = torch.Generator().manual_seed(0)
        seen = collections.Counter()
        fallbacks, errors = set(), set()
        for s in inputs:
            x = s.input
            if (not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.dim() == 0
                    or x.dim() > 4 or x.numel() == 0 or x.dtype.is_complex):
                continue
            xs = _sparsify(x, g)
            try:
                want = op(xs.clone(), *s.args, **s.kwargs)
            except Exception:   # noqa: BLE001  (dense torch refuses the sample: skip it)
                continue
            X = scorch.sparse_tensor(xs, format="coo")
            _dispatch._warned.clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                signal.alarm(timeout)
                try:
                    got = op(X, *s.args, **s.kwargs)
                except _Timeout:
                    seen["error"] += 1
                    errors.add("timeout")
                    continue
                except Exception as e:   # noqa: BLE001  (a survey: every failure is reported)
                    seen["error"] += 1
                    errors.add(f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
                    continue
                finally:
                    signal.alarm(0)
            fb = {str(w.message).split("'")[1] for w in caught if "no sparse kernel" in str(w.message)}
            if op.name in RANDOM or full in RANDOM:
                seen["random"] += 1
            elif op.name in SPARSE_MEANING:
                seen["sparse meaning"] += 1
            elif not _same(got, want, xs):
                seen["mismatch"] += 1
            elif fb:
                seen["fallback"] += 1
                fallbacks |= fb
            else:
                seen["ok"] += 1
        if seen:
            outcome[full] = (seen, fallbacks, errors)
    return outcome


def _verdict(seen) -> str:
    for k in ("mismatch", "error", "fallback", "sparse meaning", "random"):
        if seen[k]:
            return k
    return "ok"


def report(outcome, seconds: float) -> str:
    by = collections.defaultdict(list)
    for name, (seen, fb, err) in outcome.items():
        by[_verdict(seen)].append((name, fb, err))
    lines = ["# OpInfo survey: torch's op database on a sparse first input", "",
             f"Generated by `python benchmarks/report_opinfo.py` in {seconds:.0f} s; torch {torch.__version__}.",
             "Each op's verdict is its worst sample: mismatch > error > fallback > sparse meaning > random > ok.", "",
             "| verdict | ops |", "|---|---:|"]
    for k in ("ok", "fallback", "error", "mismatch", "sparse meaning", "random"):
        lines.append(f"| {k} | {len(by[k])} |")
    lines.append(f"| **all** | {len(outcome)} |")
    for k in ("mismatch", "error", "fallback", "sparse meaning", "random", "ok"):
        if not by[k]:
            continue
        lines += ["", f"## {k} ({len(by[k])})", ""]
        if k == "ok":
            lines.append(" ".join(f"`{name}`" for name, _, _ in sorted(by[k])))
            continue
        for name, fb, err in sorted(by[k]):
            why = ""
            if k == "fallback":
                why = ": " + ", ".join(f"`{f}`" for f in sorted(fb))
            elif k == "error":
                why = ": " + "; ".join(sorted(err))
            lines.append(f"- `{name}`{why}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="only these ops (OpInfo names)")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--out", default=None, help="write the markdown report here")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    t = time.time()
    outcome = survey(set(a.names), a.samples)
    text = report(outcome, time.time() - t)
    if a.out:
        Path(a.out).write_text(text)
    head = text.split("\n## ")[0]
    print(head if a.out else text)


if __name__ == "__main__":
    main()
