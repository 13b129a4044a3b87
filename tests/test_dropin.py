"""``import scorch as torch`` reaches every public torch name; only extended names differ."""
import importlib

import torch
import torch.nn.functional as torch_F
import torch.sparse as torch_sparse

import scorch
from scorch.nn import functional as F

# names scorch extends for sparse operands; everything else must be torch's own object
EXTENDED = {"einsum", "tensor", "nn", "sparse"}  # nn, sparse: modules that extend torch's (checked below)


def test_every_public_torch_name_is_reachable_and_unshadowed():
    names = set(torch.__all__) | {n for n in dir(torch) if not n.startswith("_")}
    missing, shadowed = [], []
    for name in sorted(names):
        try:
            ours = getattr(scorch, name)
        except AttributeError:
            missing.append(name)
            continue
        if name not in EXTENDED and ours is not getattr(torch, name):
            shadowed.append(name)
    assert not missing, missing[:20]
    assert not shadowed, shadowed[:20]


def test_submodules():
    assert scorch.nn.Linear is torch.nn.Linear and scorch.nn.Module is torch.nn.Module
    # dense dropout draws its mask faster (scorch.nn.dropout); the module is still torch's class
    assert issubclass(scorch.nn.Dropout, torch.nn.Dropout) and F.dropout is not torch_F.dropout
    for name in dir(torch_F):
        if not name.startswith("_") and name != "dropout":
            assert getattr(F, name) is getattr(torch_F, name), name
    for name in dir(torch_sparse):
        if not name.startswith("_"):
            assert getattr(scorch.sparse, name) is getattr(torch_sparse, name), name
    assert importlib.import_module("scorch.linalg") is torch.linalg
    assert scorch.float32 is torch.float32 and scorch.Tensor is torch.Tensor


def test_dense_einsum_is_torch():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert torch.equal(scorch.einsum("ij,jk->ik", a, b), torch.einsum("ij,jk->ik", a, b))
    assert torch.equal(scorch.einsum("ij,jk", [a, b]), torch.einsum("ij,jk", [a, b]))
    # torch's own einsum, not a @ b: on an Intel Xeon the two round differently
    assert torch.equal(scorch.einsum(a, [0, 1], b, [1, 2], [0, 2]), torch.einsum(a, [0, 1], b, [1, 2], [0, 2]))
    assert torch.equal(scorch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
