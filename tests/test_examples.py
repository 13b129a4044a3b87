"""The model examples (examples/*.py) on tiny configurations: each trains for a few steps on the
shared data and its loss must fall; the distributed GCN must give the single-process losses."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from scorch import datasets

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

pytestmark = pytest.mark.skipif(not (datasets.data_dir() / "matrices").is_dir(),
                                reason=f"no shared data at {datasets.data_dir()} (set SCORCH_DATA_DIR)")

TINY_GRAPH = dict(dataset="cora", matrix="dwt_992", features=64, density=0.05, classes=4)


def falls(first, last, by: float = 0.9) -> bool:
    return last < by * first


def test_gcn_loss_falls_and_learns():
    import gcn
    graph = gcn.load_graph(**TINY_GRAPH)
    assert type(graph.a_hat).__name__ == "SparseTensor" and graph.a_hat.format.name == "csr"
    r = gcn.train(graph, hidden=16, epochs=30, quiet=True)
    assert falls(r["losses"][0], r["losses"][-1], 0.7), r["losses"]
    assert r["train_acc"] > 0.6


@pytest.mark.parametrize("dataset", ["cora", "citeseer"])
def test_gcn_labels_use_every_class_and_follow_the_graph(dataset):
    """Smoothing alone let A_hat's stationary vector take over on a fast-mixing graph
    (G51, citeseer scale: 995 of 1,000 nodes one class); each class now holds a fair
    share, and neighbours agree far more often than by chance."""
    import gcn
    matrix, _, _, classes = gcn.DATASETS[dataset]
    m = datasets.load_matrix(matrix)
    a_hat, edges = gcn.normalized_adjacency(m)
    y = gcn.smooth_labels(a_hat, classes, torch.Generator().manual_seed(0))
    counts = torch.bincount(y, minlength=classes)
    assert int(counts.min()) > 0.4 * y.numel() / classes, counts.tolist()
    assert int(counts.max()) < 2.0 * y.numel() / classes, counts.tolist()
    agree = (y[edges[0]] == y[edges[1]]).float().mean().item()
    assert agree > 2.0 / classes, agree


def test_gcn_normalized_adjacency_matches_dense():
    import gcn
    m = datasets.load_matrix("west0067")
    a_hat, edges = gcn.normalized_adjacency(m)
    a = torch.from_numpy(abs(m).toarray()) != 0
    a = ((a | a.T) | torch.eye(m.shape[0], dtype=torch.bool)).float()
    dinv = a.sum(1).rsqrt()
    torch.testing.assert_close(a_hat.to_dense(), dinv[:, None] * a * dinv[None, :])
    assert edges.shape[1] == int(a.sum()) - m.shape[0]


def test_distributed_gcn_equals_single_process():
    import distributed_gcn
    import gcn
    args = argparse.Namespace(dataset="cora", matrix="dwt_992", features=64, feature_density=0.05,
                              classes=4, hidden=16, epochs=6, lr=0.01, dropout=0.0, seed=0,
                              threads=1, data_dir=None, quiet=True)
    try:
        losses = distributed_gcn.train_distributed(args, world_size=2)
    except torch.multiprocessing.ProcessExitedException as e:
        # torch.distributed's C++ (gloo / the TCP store) aborted a rank twice in ~35 CI runs
        # ("terminate called without an active exception", rank 0), never in 220 runs under
        # load here; the rank's faulthandler printed where. A rank that dies by a signal
        # gets one more run; an exception in the training itself, or a second abort, fails.
        if e.signal_name is None:
            raise
        warnings.warn(f"distributed GCN: {e}; running it once more")
        losses = distributed_gcn.train_distributed(args, world_size=2)
    single = gcn.train(gcn.load_graph(**TINY_GRAPH), hidden=16, epochs=6, dropout=0.0,
                       quiet=True)["losses"]
    assert len(losses) == 6
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(single), rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]


def test_sparse_autoencoder_loss_falls_fixed_and_pruned():
    import sparse_autoencoder as sae
    x_train = sae.load_images("mnist", "train", limit=512)
    x_test = sae.load_images("fashion-mnist", "test", limit=128)
    r = sae.train(x_train, x_test, hidden=32, density=0.1, epochs=2, batch_size=64, quiet=True)
    assert falls(r["epochs"][0], r["epochs"][-1]), r["epochs"]
    assert r["test_loss"] < 0.2
    p = sae.train(x_train, x_test, hidden=32, density=0.05, epochs=2, batch_size=64, prune=True,
                  quiet=True)
    assert p["weight_nnz"] < 0.6 * 4 * 0.05 * 32 * 784   # pruned from 4x the target density
    assert falls(p["epochs"][0], p["epochs"][-1]), p["epochs"]


def test_moe_loss_falls_and_gate_is_sparse():
    import moe
    x = moe.load_images("mnist", "train", limit=1024)
    y = moe.load_labels("mnist", "train", limit=1024)
    layer = moe.MoE(784, 8, experts=4, k=2)
    g = layer.gates(x[:5])
    assert type(g).__name__ == "SparseTensor" and g.nnz == 10
    y_moe, _ = layer(x[:5])
    dense_gates = g.detach().to_dense()
    reference = torch.einsum("bd,ndh,bn->bh", x[:5], layer.weight, dense_gates) + dense_gates @ layer.bias
    torch.testing.assert_close(y_moe, reference, rtol=1e-4, atol=1e-5)
    r = moe.train(x, y, x[:256], y[:256], hidden=16, experts=4, k=2, epochs=2, batch_size=128, lr=3e-3,
                  quiet=True)
    assert falls(sum(r["steps"][:2]), sum(r["steps"][-2:]), 0.8), r["steps"]


def _tiny_imdb(n_train: int = 32, seq_len: int = 32):
    import sparse_attention as sa
    texts, labels = sa.load_reviews(limit=n_train)
    ids, vocab = sa.tokenize(texts, seq_len, size=500)
    return sa, ids, labels, len(vocab) + 2


def test_bigbird_pattern_and_sparse_equals_dense_attention():
    sa, ids, labels, vocab = _tiny_imdb()
    p = sa.bigbird_pattern(64, block=8, generator=torch.Generator().manual_seed(0)).to_dense()
    assert p[:16].all() and p[:, :16].all()                   # 2 global blocks
    assert all(p[i, max(0, i - 8)] for i in range(64))        # the window
    assert p.sum() < 64 * 64
    torch.manual_seed(0)
    sparse = sa.BigBirdClassifier(vocab, 32, block=8, layers=1).eval()
    torch.manual_seed(0)
    dense = sa.BigBirdClassifier(vocab, 32, block=8, layers=1, dense=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(sparse(ids[:4]), dense(ids[:4]), rtol=1e-4, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), blocks=st.integers(1, 5),
       block=st.sampled_from([1, 2, 4]), dim=st.integers(1, 5),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 99))
def test_bigbird_attention_gradients_equal_dense_masked(batch, heads, blocks, block, dim, dtype, seed):
    """SDDMM scores on the (batch, heads, i, j) pattern, the sparse softmax and its backward
    (fiber_ops: the gradient carried from the result's pattern to the scores' pattern by
    value order), sparse @ dense: q, k, v gradients equal dense masked attention's."""
    import scorch
    import sparse_attention as sa
    gen = torch.Generator().manual_seed(seed)
    n = blocks * block
    pattern = sa.bigbird_pattern(n, block, window=1, global_blocks=1, random_blocks=1, generator=gen)
    qkv = [torch.randn(batch, heads, n, dim, generator=gen, dtype=dtype) for _ in range(3)]
    weight = torch.randn(batch, heads, n, dim, generator=gen, dtype=dtype)
    allowed = pattern.to_dense() != 0

    def sparse(q, k, v):
        return torch.softmax(scorch.einsum("ij,bhid,bhjd->bhij", pattern.to(dtype), q, k) * 0.5, -1) @ v

    def dense(q, k, v):
        return ((q @ k.transpose(-1, -2)) * 0.5).masked_fill(~allowed, float("-inf")).softmax(-1) @ v

    grads = []
    for attend in (sparse, dense):
        leaves = [x.clone().requires_grad_() for x in qkv]
        (attend(*leaves) * weight).sum().backward()
        grads.append([x.grad for x in leaves])
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("attention", ["sparse", "dense"])
def test_bigbird_loss_falls(attention):
    sa, ids, labels, vocab = _tiny_imdb()
    r = sa.train(ids, labels, ids[:8], labels[:8], vocab, block=8, epochs=6, batch_size=16,
                 lr=3e-3, dense=attention == "dense", quiet=True, layers=1)
    assert falls(sum(r["steps"][:2]), sum(r["steps"][-2:]), 0.8), r["steps"]
