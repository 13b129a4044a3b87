"""The SparseTensor type: attributes, dtypes, module integration, views, errors."""
import copy
import io
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch import SparseTensor, Format


def example(dtype=torch.float32):
    x = torch.tensor([[0, 1, 0, 2], [0, 0, 0, 0], [3, 0, 0, 4]]).to(dtype)
    return x, scorch.sparse_tensor(x, format="csr")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool])
def test_attributes(dtype):
    x, s = example(dtype)
    assert isinstance(s, torch.Tensor) and isinstance(s, SparseTensor)
    assert s.shape == (3, 4) and s.dtype == dtype and s.format == Format("dc") and s.nnz == 4
    assert s.index_dtype == torch.int32
    assert torch.equal(s.to_dense(), x)
    assert torch.equal(s.values(), x[x != 0])
    assert s.indices().tolist() == [[0, 0, 2, 2], [1, 3, 0, 3]]
    r = repr(s)
    for part in ("csr", "(3, 4)", "nnz=4", str(dtype)):
        assert part in r


def test_default_format_is_coo():
    s = scorch.sparse_tensor(torch.eye(3))
    assert s.format == scorch.as_format("coo", 2) and s.nnz == 3
    s = scorch.tensor([[1.0, 0.0], [0.0, 2.0]], format="csc")
    assert s.format.name == "csc" and torch.equal(s.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 2.0]]))


def test_coordinate_constructor_sums_duplicates():
    idx = torch.tensor([[1, 0, 1], [2, 0, 2]])
    s = scorch.sparse_tensor((idx, torch.tensor([1.0, 2.0, 3.0])), size=(2, 3), format="csr")
    assert s.nnz == 2 and torch.equal(s.to_dense(), torch.tensor([[2.0, 0, 0], [0, 0, 4.0]]))


def test_int64_indices_when_a_dimension_does_not_fit_int32():
    big = 2**31 + 10
    s = scorch.sparse_tensor((torch.tensor([[5, big - 1]]), torch.tensor([1.0, 2.0])), size=(big,))
    assert s.index_dtype == torch.int64 and s.nnz == 2
    assert s.indices().tolist() == [[5, big - 1]]


def test_conversion_never_densifies_a_huge_tensor():
    n = 10**9  # dense would be 4e18 bytes
    idx = torch.tensor([[3, 7, 7, n - 1], [n - 2, 1, 5, 0]])
    s = scorch.sparse_tensor((idx, torch.arange(4.0)), size=(n, n))
    for fmt in ["dcsr", "dcsc", "coo", Format("qc"), Format("cq", (1, 0))]:
        t = s.to_format(fmt)
        assert t.nnz == 4 and t.to_format("coo").indices().tolist() == idx.tolist()


def test_permute_is_a_view():
    x, s = example()
    t = s.t()
    assert isinstance(t, SparseTensor) and t.shape == (4, 3)
    assert t.format == Format("dc", (1, 0))
    assert t.values().data_ptr() == s.values().data_ptr()
    assert torch.equal(t.to_dense(), x.t())
    x3 = torch.rand(2, 3, 4) * (torch.rand(2, 3, 4) < 0.5)
    s3 = scorch.sparse_tensor(x3, format="csf").permute(2, 0, 1)
    assert torch.equal(s3.to_dense(), x3.permute(2, 0, 1))


def test_module_buffer_and_parameter():
    x, s = example()
    m = torch.nn.Module()
    m.register_buffer("adj", s)
    m.w = torch.nn.Parameter(scorch.sparse_tensor(x, format="coo"))
    assert isinstance(m.w, torch.nn.Parameter) and isinstance(m.w, SparseTensor)
    assert m.w.requires_grad and [n for n, _ in m.named_parameters()] == ["w"]
    m = m.double()
    assert m.w.dtype == torch.float64 and m.adj.dtype == torch.float64
    assert isinstance(m.w, SparseTensor) and torch.equal(m.adj.to_dense(), x.double())
    sd = m.state_dict()
    assert isinstance(sd["adj"], SparseTensor)
    m2 = torch.nn.Module()
    m2.register_buffer("adj", scorch.sparse_tensor(torch.zeros(3, 4, dtype=torch.float64), format="csr"))
    m2.w = torch.nn.Parameter(scorch.sparse_tensor(torch.zeros(3, 4, dtype=torch.float64), format="coo"))
    m2.load_state_dict(sd)
    assert torch.equal(m2.adj.to_dense(), x.double()) and m2.adj.format.name == "csr"
    m3 = copy.deepcopy(m)
    assert torch.equal(m3.w.to_dense(), m.w.to_dense())
    assert m3.w.values().data_ptr() != m.w.values().data_ptr()


def test_pickle_and_torch_save():
    x, s = example()
    assert torch.equal(pickle.loads(pickle.dumps(s)).to_dense(), x)
    buf = io.BytesIO()
    torch.save({"s": s}, buf)
    buf.seek(0)
    t = torch.load(buf, weights_only=False)["s"]
    assert t.format == s.format and torch.equal(t.to_dense(), x)


def test_dtype_cast_and_clone():
    x, s = example()
    d = s.to(torch.float64)
    assert isinstance(d, SparseTensor) and d.dtype == torch.float64 and d.format == s.format
    c = s.clone()
    assert c.values().data_ptr() != s.values().data_ptr() and torch.equal(c.to_dense(), x)
    assert s.detach().values().data_ptr() == s.values().data_ptr()


def test_unsupported_op_runs_dense_with_a_warning(monkeypatch):
    from scorch import _dispatch
    monkeypatch.setattr(_dispatch, "_warned", set())   # once per op per process: another test may have warned
    x, s = example()
    with pytest.warns(UserWarning, match="no sparse kernel"):
        out = F.interpolate(s[None, None], size=(1, 4), mode="bilinear", antialias=True)
    assert torch.equal(out, F.interpolate(x[None, None], size=(1, 4), mode="bilinear", antialias=True))
    with pytest.raises(RuntimeError, match="in-place"):
        s.exp_()
    s.mul_(2)   # zero-preserving in-place ops update the stored values
    assert torch.equal(s.to_dense(), 2 * x)


@pytest.mark.parametrize("bad,match", [
    (dict(data=(torch.tensor([[0, 5]]), torch.tensor([1.0, 2.0])), size=(3,)), "out of range|indices"),
    (dict(data=(torch.tensor([[0, 1]]), torch.tensor([1.0])), size=(3,)), "values"),
    (dict(data=(torch.tensor([[0.0, 1.0]]), torch.tensor([1.0, 2.0])), size=(3,)), "indices must be integers"),
    (dict(data=(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0])), size=(-3,)), "size.*negative"),
    (dict(data=(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0])), size=(float("nan"),)), "size.*NaN"),
    (dict(data=(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0])), size=(3, 3)), "rows but size"),
    (dict(data=torch.eye(3), format="csx"), "unknown format"),
    (dict(data=torch.ones(2, 2, 2), format="csr"), "levels but the tensor has 3"),
    (dict(data=torch.ones(3, 3), format="csr", size=(3, 4)), "disagrees"),
])
def test_bad_input_errors_name_the_problem(bad, match):
    with pytest.raises(ValueError, match=match):
        scorch.sparse_tensor(**bad)


def test_unsupported_dtype():
    with pytest.raises(TypeError, match="dtype"):
        scorch.sparse_tensor(torch.zeros(2, 2, dtype=torch.uint16), format="csr")
