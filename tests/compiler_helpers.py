"""Shared helpers of the compiler tests: operands in any format (built with the numpy
reference model, so the tests do not depend on the conversion runtime) and dense copies."""
from __future__ import annotations

import torch

from reference_storage import reference_from_dense, reference_to_dense
from scorch.formats import Format, as_format
from scorch.level_storage import Storage


def sparse(x: torch.Tensor, fmt, index_dtype=None) -> Storage:
    f = fmt if isinstance(fmt, Format) else as_format(fmt, x.dim())
    st = reference_from_dense(x, f)
    if index_dtype is not None and st.index_dtype != index_dtype:
        from scorch.level_storage import Level
        lv = [Level(l.kind, l.dim, l.size,
                    None if l.pos is None else l.pos.to(index_dtype),
                    None if l.crd is None else l.crd.to(index_dtype), l.block_inner)
              for l in st.levels]
        st = Storage(st.format, st.shape, lv, st.values, index_dtype)
    return st


def dense(r) -> torch.Tensor:
    if isinstance(r, torch.Tensor):
        return r
    return reference_to_dense(r)


def rand(shape, density=0.5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    mask = torch.rand(shape, generator=g) < density
    return x * mask


def check_storage(st: Storage):
    """Structural invariants of an output storage: sorted unique coordinates per segment."""
    from scorch.formats import LevelKind
    parent_count = 1
    for k, lv in enumerate(st.levels):
        if lv.kind is LevelKind.DENSE:
            parent_count *= lv.size
            continue
        if lv.pos is not None:
            pos = lv.pos.to(torch.int64)
            assert pos.numel() == parent_count + 1
            assert bool((pos[1:] >= pos[:-1]).all())
            parent_count = int(pos[-1])
        assert lv.crd.numel() == parent_count
        if lv.crd.numel():
            assert int(lv.crd.min()) >= 0 and int(lv.crd.max()) < lv.size
    assert st.values.numel() == parent_count
    # no duplicate coordinates
    from reference_storage import reference_coords
    import numpy as np
    c = reference_coords(st)
    if c.shape[1]:
        assert np.unique(c, axis=1).shape[1] == c.shape[1]


def topk_gate(b: int, n: int, k: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """A dense (b, n) mixture-of-experts gate with k positive entries per row (top-k of
    random logits)."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.zeros(b, n, dtype=dtype)
    if b and n and k:
        chosen = torch.rand(b, n, generator=g).topk(k, dim=1).indices
        dense.scatter_(1, chosen, torch.rand(b, k, generator=g, dtype=dtype) + 0.1)
    return dense
