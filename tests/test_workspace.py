"""The kernel workspaces: accumulation against a dict model, drain order, reuse, dtypes, and a
generated-kernel-style .pyx that cimports them inside an OpenMP prange."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scorch._runtime.workspace import PyDenseWorkspace, PySparseWorkspace

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]


def model(coords, values):
    acc = {}
    for c, v in zip(coords, values):
        acc[c] = acc.get(c, 0) + v
    keys = sorted(acc)
    return keys, [acc[k] for k in keys]


def make(kind, extent, dtype):
    return PySparseWorkspace(dtype) if kind == "sparse" else PyDenseWorkspace(extent, dtype)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["sparse", "dense"]), dtype=st.sampled_from(DTYPES),
       extent=st.integers(1, 300), data=st.data())
def test_random_accumulation_matches_dict(kind, dtype, extent, data):
    ws = make(kind, extent, dtype)
    for _round in range(3):  # the same instance serves several fibers
        n = data.draw(st.integers(0, 200))
        coords = data.draw(st.lists(st.integers(0, extent - 1), min_size=n, max_size=n))
        values = data.draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n))
        half = n // 2
        for c, v in zip(coords[:half], values[:half]):
            ws.add(c, v)
        ws.add_many(torch.tensor(coords[half:], dtype=torch.int64), torch.tensor(values[half:]))
        keys, sums = model(coords, values)
        assert ws.size() == len(keys) == len(ws)
        for k, s in zip(keys[:5], sums[:5]):
            assert ws.get(k) == s
        index_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
        offset = data.draw(st.integers(0, 3))
        crd = torch.full((offset + len(keys) + 2,), -1, dtype=index_dtype)
        vals = torch.zeros(offset + len(keys) + 2, dtype=dtype)
        end = ws.drain(crd, vals, offset)
        assert end == offset + len(keys)
        assert crd[offset:end].tolist() == keys
        assert vals[offset:end].tolist() == pytest.approx(sums)
        assert crd[:offset].tolist() == [-1] * offset and crd[end:].tolist() == [-1, -1]
        assert ws.size() == 0


def test_float_accumulation_in_order():
    rng = np.random.default_rng(0)
    c = rng.integers(0, 50, 5000)
    v = rng.normal(size=5000)
    for ws in (PySparseWorkspace(torch.float64), PyDenseWorkspace(50, torch.float64)):
        ws.add_many(torch.from_numpy(c), torch.from_numpy(v))
        crd, vals = ws.drain_arrays()
        expect = np.zeros(50)
        for ci, vi in zip(c, v):  # same left-to-right order: bitwise equal sums
            expect[ci] += vi
        assert crd.tolist() == sorted(set(c.tolist()))
        assert np.array_equal(vals.numpy(), expect[crd.numpy()])


@pytest.mark.parametrize("extent, count", [(1000, 10), (100, 90)])  # sort path and marker-scan path
def test_dense_drain_sorted_unsorted_scatter_reset(extent, count):
    rng = np.random.default_rng(1)
    coords = rng.permutation(extent)[:count]
    ws = PyDenseWorkspace(extent, torch.float32)
    ws.add_many(torch.from_numpy(coords), torch.arange(count, dtype=torch.float32))
    crd, vals = ws.drain_arrays(sorted=False)
    assert crd.tolist() == coords.tolist()  # first-touch order
    assert vals.tolist() == list(range(count))
    ws.add_many(torch.from_numpy(coords), torch.ones(count))
    crd, vals = ws.drain_arrays(sorted=True)
    assert crd.tolist() == sorted(coords.tolist()) and vals.tolist() == [1.0] * count
    ws.add(3, 2.0)
    ws.add(3, 5.0)
    out = torch.zeros(extent)
    ws.scatter(out)
    assert out[3] == 7.0 and out.count_nonzero() == 1 and ws.size() == 0
    ws.add(4, 1.0)
    ws.reset()
    assert ws.size() == 0 and ws.get(4) == 0
    ws.add(4, 2.0)  # a reset entry starts again from the new value
    assert ws.get(4) == 2.0
    ws.resize(5)
    assert ws.extent == 5 and ws.size() == 0
    with pytest.raises(IndexError):
        ws.add(5, 1.0)


def test_sparse_workspace_huge_coordinates_and_errors():
    ws = PySparseWorkspace(torch.int64)
    ws.add(2**40, 3)
    ws.add(-1 + 2**40, 4)
    ws.add(2**40, 5)
    crd, vals = ws.drain_arrays()
    assert crd.tolist() == [2**40 - 1, 2**40] and vals.tolist() == [4, 8]
    with pytest.raises(TypeError, match="workspace dtype"):
        PySparseWorkspace(torch.bool)
    ws.add(1, 1)
    with pytest.raises(ValueError, match="vals must be"):
        ws.drain(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.float32))
    with pytest.raises(ValueError, match="too short"):
        ws.drain(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 1)


KERNEL = textwrap.dedent('''
    # distutils: language = c++
    from libc.stdint cimport int32_t, int64_t
    from cython.parallel cimport parallel, prange
    from scorch._runtime.workspace cimport SparseWorkspace, DenseWorkspace

    def fold_rows(const int32_t[::1] pos, const int32_t[::1] crd, const double[::1] vals,
                  int64_t m, bint use_dense, int32_t[::1] out_pos, int32_t[::1] out_crd,
                  double[::1] out_vals, int nthreads):
        """Row i of the result holds sum of vals[p] at coordinate crd[p] % m (two phases)."""
        cdef int64_t nrows = pos.shape[0] - 1, i, p, end
        cdef SparseWorkspace[double]* sw
        cdef DenseWorkspace[double]* dw
        with nogil, parallel(num_threads=nthreads):
            sw = new SparseWorkspace[double]()
            dw = new DenseWorkspace[double](m)
            for i in prange(nrows, schedule='dynamic'):
                for p in range(pos[i], pos[i + 1]):
                    if use_dense:
                        dw.add(crd[p] % m, vals[p])
                    else:
                        sw.add(crd[p] % m, vals[p])
                out_pos[i + 1] = <int32_t>(dw.size() if use_dense else sw.size())
                dw.reset()
                sw.clear()
            del sw
            del dw
        for i in range(nrows):
            out_pos[i + 1] += out_pos[i]
        with nogil, parallel(num_threads=nthreads):
            sw = new SparseWorkspace[double]()
            dw = new DenseWorkspace[double](m)
            for i in prange(nrows, schedule='dynamic'):
                for p in range(pos[i], pos[i + 1]):
                    if use_dense:
                        dw.add(crd[p] % m, vals[p])
                    else:
                        sw.add(crd[p] % m, vals[p])
                if use_dense:
                    end = dw.drain(&out_crd[0], &out_vals[0], out_pos[i])
                else:
                    end = sw.drain(&out_crd[0], &out_vals[0], out_pos[i])
            del sw
            del dw
''')


def test_kernel_cimports_workspace_inside_prange(tmp_path, monkeypatch):
    """The cimport path a generated kernel takes, compiled by the kernel build itself."""
    build = pytest.importorskip("scorch.tensor_compiler.build")
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path))
    mod = build.load_kernel(KERNEL, "test_workspace_prange")
    rng = np.random.default_rng(2)
    nrows, ncols, m = 500, 400, 37
    dense = (rng.random((nrows, ncols)) < 0.05) * rng.normal(size=(nrows, ncols))
    pos = np.concatenate([[0], np.cumsum((dense != 0).sum(1))]).astype(np.int32)
    rows, cols = np.nonzero(dense)
    vals = dense[rows, cols]
    folded = np.zeros((nrows, m))
    np.add.at(folded, (rows, cols % m), vals)
    touched = np.zeros((nrows, m), bool)
    touched[rows, cols % m] = True
    for use_dense in (False, True):
        out_pos = np.zeros(nrows + 1, np.int32)
        out_crd = np.zeros(touched.sum(), np.int32)
        out_vals = np.zeros(touched.sum())
        mod.fold_rows(pos, cols.astype(np.int32), vals, m, use_dense, out_pos, out_crd, out_vals, 2)
        r, c = np.nonzero(touched)
        assert np.array_equal(out_pos, np.concatenate([[0], np.cumsum(touched.sum(1))]))
        assert np.array_equal(out_crd, c)
        np.testing.assert_allclose(out_vals, folded[r, c], rtol=1e-12, atol=1e-12)


def test_sparse_workspace_combines_as_it_grows():
    """The sparse workspace appends pairs and combines them (a stable radix sort, a merge
    with what was combined before) when read or when the pending pairs double: reads
    between adds, thousands of distinct coordinates over a 2^62 range (negative ones too)
    and repeated ones all give a dict's sums, in the order of the adds (bitwise for
    floats)."""
    rng = np.random.default_rng(1)
    ws = PySparseWorkspace(torch.float64)
    expect = {}
    for round_ in range(5):
        c = (rng.integers(-(1 << 62), 1 << 62, 3000) if round_ == 4 else
             rng.integers(0, 1 << 62, 3000) if round_ % 2 else rng.integers(0, 700, 3000))
        v = rng.normal(size=3000)
        for k in range(0, 3000, 500):
            ws.add_many(torch.from_numpy(c[k:k + 500]), torch.from_numpy(v[k:k + 500]))
            for ci, vi in zip(c[k:k + 500].tolist(), v[k:k + 500].tolist()):
                expect[ci] = expect.get(ci, 0.0) + vi
            probe = int(c[k])
            assert ws.get(probe) == expect[probe] and ws.size() == len(expect)
    crd, vals = ws.drain_arrays()
    keys = sorted(expect)
    assert crd.tolist() == keys
    assert vals.tolist() == [expect[k] for k in keys]
