"""A slow, obviously-correct numpy model of level storage: the oracle the Cython runtime is
tested against. Not used by the library itself."""
from __future__ import annotations

import numpy as np
import torch

from scorch.formats import Format, LevelKind
from scorch.level_storage import Level, Storage, index_dtype_for, level_kinds, level_sizes, run_heads


def _split_blocks(coords: np.ndarray, fmt: Format) -> np.ndarray:
    """Coordinates in stored-level order (block grid first, then inside the block)."""
    if fmt.block is None:
        return coords[list(fmt.mode_order)]
    blk = np.asarray(fmt.block).reshape(-1, 1)
    outer, inner = coords // blk, coords % blk
    return np.concatenate([outer[list(fmt.mode_order)], inner], axis=0)


def reference_from_coords(coords, values, shape, fmt: Format) -> Storage:
    """Storage of ``fmt`` holding ``values`` at ``coords`` (ndim x n), duplicates summed.

    Dense levels store every coordinate below a stored parent, so the result holds zeros
    where a dense level has no input entry."""
    coords = np.asarray(coords, dtype=np.int64).reshape(len(shape), -1)
    values = torch.as_tensor(values)
    vals = values.numpy() if values.dtype != torch.bool else values.numpy().astype(np.int8)
    kinds = level_kinds(fmt)
    sizes = level_sizes(shape, fmt)
    heads = run_heads(kinds)
    lc = _split_blocks(coords, fmt)  # nlevels x n
    order = np.lexsort(lc[::-1]) if lc.shape[1] else np.zeros(0, np.int64)
    lc = lc[:, order]
    vals = vals[order]
    n = lc.shape[1]
    parent = np.zeros(n, np.int64)  # position of each entry at the previous level
    parent_count = 1
    built = []
    k = 0
    nlev = len(kinds)
    while k < nlev:
        kind = kinds[k]
        dim, size, inner = sizes[k]
        if kind is LevelKind.DENSE:
            parent = parent * size + lc[k]
            parent_count *= size
            built.append((kind, dim, size, inner, None, None))
            k += 1
            continue
        # compressed: one level; coordinate: the whole run of coordinate levels at once
        end = k + 1
        if kind is LevelKind.COORDINATE:
            while end < nlev and kinds[end] is LevelKind.COORDINATE:
                end += 1
        key = np.vstack([parent[None, :], lc[k:end]])
        if n:
            new = np.ones(n, bool)
            new[1:] = np.any(key[:, 1:] != key[:, :-1], axis=0)
        else:
            new = np.zeros(0, bool)
        uniq = np.nonzero(new)[0]
        pos = np.zeros(parent_count + 1, np.int64)
        np.add.at(pos, parent[uniq] + 1, 1)
        pos = np.cumsum(pos)
        for j in range(k, end):
            d, s, inn = sizes[j]
            built.append((kinds[j], d, s, inn, pos if j == k else None, lc[j, uniq]))
        parent = np.cumsum(new) - 1
        parent_count = len(uniq)
        k = end
    out_vals = np.zeros(parent_count, dtype=vals.dtype)
    np.add.at(out_vals, parent, vals)
    if values.dtype == torch.bool:
        out_vals = out_vals != 0
    idx = index_dtype_for(shape, max(parent_count, n))
    levels = [Level(kind, d, s,
                    None if p is None else torch.from_numpy(p).to(idx),
                    None if c is None else torch.from_numpy(np.ascontiguousarray(c)).to(idx), inn)
              for kind, d, s, inn, p, c in built]
    assert all(h == (lv.pos is not None) for h, lv in zip(heads, levels))
    return Storage(fmt, shape, levels, torch.from_numpy(out_vals), idx)


def reference_from_dense(x: torch.Tensor, fmt: Format) -> Storage:
    nz = np.nonzero(x.numpy())
    coords = np.vstack(nz) if x.dim() else np.zeros((0, 1), np.int64)
    return reference_from_coords(coords, x[nz] if x.dim() else x.reshape(1), tuple(x.shape), fmt)


def reference_coords(st: Storage) -> np.ndarray:
    """ndim x nnz coordinates of every stored value, in storage order."""
    parent_coords = np.zeros((0, 1), np.int64)  # levels-so-far x parent_count
    parent_count = 1
    for lv in st.levels:
        if lv.kind is LevelKind.DENSE:
            rep = np.repeat(parent_coords, lv.size, axis=1)
            here = np.tile(np.arange(lv.size), parent_count)
            parent_count *= lv.size
        elif lv.pos is not None:
            pos = lv.pos.numpy().astype(np.int64)
            owners = np.repeat(np.arange(parent_count), np.diff(pos))
            rep = parent_coords[:, owners]
            here = lv.crd.numpy().astype(np.int64)
            parent_count = len(here)
        else:
            rep = parent_coords
            here = lv.crd.numpy().astype(np.int64)
        parent_coords = np.vstack([rep, here[None, :]])
    coords = np.zeros((st.ndim, parent_count), np.int64)
    for lv, row in zip(st.levels, parent_coords):
        if st.format.block is None:
            coords[lv.dim] = row
        elif lv.block_inner:
            coords[lv.dim] += row
        else:
            coords[lv.dim] += row * st.format.block[lv.dim]
    return coords


def reference_to_dense(st: Storage) -> torch.Tensor:
    out = torch.zeros(st.shape, dtype=st.dtype)
    coords = reference_coords(st)
    if st.ndim == 0:
        return st.values.reshape(())
    out.index_put_(tuple(torch.from_numpy(c) for c in coords), st.values, accumulate=True)
    return out
