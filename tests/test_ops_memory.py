"""The op surface on a 2,000,000 x 2,000,000 matrix with 2,000,000 stored entries, in a
subprocess whose address space is capped at 3 GB: every op must follow the stored entries (a
dense copy would be 32 TB), and an op with no sparse kernel must raise, not allocate."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    import warnings
    import torch
    import torch.nn.functional as F
    import scorch
    warnings.simplefilter("error")            # no dense fallback anywhere

    n, nnz = 2_000_000, 2_000_000
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (2, nnz), generator=g)
    vals = torch.rand(nnz, dtype=torch.float64, generator=g) + 0.5
    A = scorch.sparse_tensor((idx, vals), size=(n, n), format="csr")
    B = A.to_format("coo")
    total = float(A.values().sum())
    X = torch.rand(n, 2, dtype=torch.float64, generator=g)
    v = X[:, 0].contiguous()

    def check(name, got, shape, sparse=None):
        assert tuple(got.shape) == shape, (name, tuple(got.shape), shape)
        if sparse is not None:
            assert isinstance(got, scorch.SparseTensor) == sparse, (name, type(got))
        print("ok", name, flush=True)

    ref = torch.zeros(n, 2, dtype=torch.float64).index_add_(0, A.indices()[0], A.values()[:, None] * X[A.indices()[1]])
    AX = A @ X
    assert torch.allclose(AX, ref)
    check("A @ X", AX, (n, 2), False)
    check("mm", torch.mm(A, X), (n, 2), False)
    check("mv", torch.mv(A, v), (n,), False)
    check("A.T @ X", A.T @ X, (n, 2), False)
    check("X.T @ A", X.T @ A, (2, n), False)
    check("addmm", torch.addmm(X, A, X, beta=0.5, alpha=2), (n, 2), False)
    check("linear", F.linear(X.T.contiguous(), A), (2, n), False)
    check("sum", A.sum(), ())
    assert abs(float(A.sum()) - total) < 1e-6 * total
    check("sum(0)", A.sum(0), (n,))
    check("sum(1, keepdim)", A.sum(1, keepdim=True), (n, 1))
    check("mean(1)", A.mean(1), (n,))
    check("sparse.sum", torch.sparse.sum(B, 0), (n,), True)
    check("A + B", A + B, (n, n), True)
    check("A - A", A - A, (n, n), True)
    check("A * B", A * B, (n, n), True)
    check("A * col", A * v[:, None], (n, n), True)
    check("A / 2", A / 2, (n, n), True)
    check("-A", -A, (n, n), True)
    # comparisons, selections and logical ops: sparse where they keep 0 where nothing is stored
    check("A > 0", A > 0, (n, n), True)
    assert (A > 0).nnz == A.nnz
    check("A < -1", A < -1, (n, n), True)
    check("A != 0", A != 0, (n, n), True)
    check("A < B", A < B, (n, n), True)
    check("A > B", torch.gt(A, B), (n, n), True)
    check("ne(A, B)", torch.ne(A, B), (n, n), True)
    check("where", torch.where(A > 1, A, 0), (n, n), True)
    check("where(mask, A, B)", torch.where(A > 1, A, B), (n, n), True)
    check("masked_fill", A.masked_fill(A > 1, 2.5), (n, n), True)
    check("logical_and", torch.logical_and(A > 1, B), (n, n), True)
    check("logical_or", torch.logical_or(A > 1, B > 1), (n, n), True)
    check("logical_xor", torch.logical_xor(A > 1, B), (n, n), True)
    check("bool &", (A > 1) & (B > 1), (n, n), True)
    check("maximum", torch.maximum(A, B), (n, n), True)
    check("minimum", torch.minimum(A, -B), (n, n), True)
    for name, dense_by_nature in (("eq", lambda: torch.eq(A, B)), ("A == 0", lambda: A == 0),
                                  ("logical_not", lambda: torch.logical_not(A)),
                                  ("A / B", lambda: A / B)):
        try:
            dense_by_nature()
        except scorch.DenseFallbackError:
            print("ok dense by nature raised:", name, flush=True)
        else:
            raise AssertionError(f"{name} on a 2M x 2M sparse matrix did not raise")
    C = A.clone(); C.mul_(2); C.add_(A)
    assert torch.allclose(C.values(), 3 * A.values())
    check("reshape", A.reshape(n // 2, 2 * n), (n // 2, 2 * n), True)
    check("flatten", A.flatten(), (n * n,), True)
    check("unsqueeze", A.unsqueeze(0), (1, n, n), True)
    check("squeeze", A.unsqueeze(1).squeeze(1), (n, n), True)
    check("t", A.t(), (n, n), True)
    check("aten.t", torch.ops.aten.t.default(A), (n, n), True)
    check("permute", A.permute(1, 0), (n, n), True)
    check("cat", torch.cat([A, B], 1), (n, 2 * n), True)
    check("stack", torch.stack([A, B]), (2, n, n), True)
    check("slice", A[5:n:3, 7:], (len(range(5, n, 3)), n - 7), True)
    check("row", A[n - 1], (n,), True)
    check("index", A[torch.tensor([5, 7, n - 1])], (3, n), True)
    check("index_select", B.index_select(1, torch.tensor([3, 9])), (n, 2), True)
    # session 18: layout, summaries, in-place and value functions
    check("select", A.select(1, 7), (n,), True)
    check("split", torch.split(A, [n // 2, n - n // 2])[1], (n - n // 2, n), True)
    check("chunk", A.chunk(3, 1)[2], (n, n - 2 * -(-n // 3)), True)
    check("pad", F.pad(A, (1, 2, 0, -1)), (n - 1, n + 3), True)
    check("block_diag", torch.block_diag(A, B), (2 * n, 2 * n), True)
    check("diag_embed", torch.diag_embed(A[7]), (n, n), True)
    check("diagonal(1)", A.diagonal(1), (n - 1,), True)
    check("index_fill", A.index_fill(0, torch.tensor([3, 5]), 0.0), (n, n), True)
    rows = torch.tensor([3, 5, 11])
    check("index_put rows", A.index_put((rows,), torch.tensor(0.0, dtype=A.dtype)), (n, n), True)
    W = A.clone()
    W[rows] = 0.0
    W[7, :] = 0.0
    W[:, 9] = 0.0
    W[2:n:3] = 0.0
    W[rows[:2], rows[1:]] = 0.0
    check("setitem rows / row / column / positions", W, (n, n), True)
    check("tile", A.tile(1, 2), (n, 2 * n), True)
    check("nansum(1)", torch.nansum(A, 1), (n,))
    check("nanmean(0)", torch.nanmean(A, 0), (n,))
    check("aminmax", torch.aminmax(A).max, ())
    check("std_mean", torch.std_mean(A, 1)[0], (n,))
    check("linalg.norm", torch.linalg.norm(A), ())
    check("histc", torch.histc(A, 10), (10,))
    check("unique", torch.unique(A), (A.nnz + 1,))
    check("gelu tanh", F.gelu(A, approximate="tanh"), (n, n), True)
    check("xlogy", torch.xlogy(A, 2.0), (n, n), True)
    check("softmin", F.softmin(A, 1), (n, n), True)
    check("glu", F.glu(A, 1), (n, n // 2), True)
    check("embedding_bag", F.embedding_bag(torch.tensor([[0, n - 1]]), A, mode="sum"), (1, n))
    D = A.clone(); D.relu_(); F.relu(D, inplace=True); D.clamp_(-1, 1)
    check("relu_", D, (n, n), True)
    assert D.nnz == A.nnz
    got = A[idx[0, :1000], idx[1, :1000]]       # a gather of stored entries by coordinates
    check("A[rows, cols]", got, (1000,), True)
    assert got.nnz == 1000 and bool((got.values() >= 0.5).all())   # each one a stored entry
    try:
        torch.exp(A)
    except scorch.DenseFallbackError as e:
        assert "'exp'" in str(e)
        print("ok fallback raised", flush=True)
    else:
        raise AssertionError("exp on a 2M x 2M sparse matrix did not raise")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print("peak RSS MiB", peak, flush=True)
""")


def test_whole_op_surface_on_a_2m_by_2m_matrix_under_3gb():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ok fallback raised" in out.stdout
    peak = int(out.stdout.strip().splitlines()[-1].split()[-1])
    assert peak < 3 * 1024


PRODUCT_TOO_LARGE = textwrap.dedent(r"""
    import resource
    import torch
    import scorch
    torch.set_num_threads(2)
    n = 12000                       # one full row times one full column: n * n entries
    ones = torch.ones(n)
    col0 = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.long)])
    A = scorch.sparse_tensor((col0, ones), size=(n, n), format="csr")
    B = scorch.sparse_tensor((col0.flip(0), ones), size=(n, n), format="csr")
    small = scorch.sparse_tensor(torch.eye(3), format="csr")
    small @ small                   # the SpGEMM kernel loaded before the cap
    v, small_v = (scorch.sparse_tensor(torch.ones(k), format="c") for k in (n, 3))
    torch.outer(small_v, small_v)   # the outer product's (coordinate tuples) too
    vm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize")][0]
    resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
    try:
        A @ B                       # 144M entries, 1.2 GB: more than the 256 MB left
    except MemoryError as e:
        print("MemoryError:", e, flush=True)
    try:
        torch.outer(v, v)           # coordinate tuples: 144M entries, 3.5 GB
    except MemoryError as e:
        print("outer MemoryError:", e, flush=True)
    print("alive", float((small @ small).to_dense().sum()), flush=True)
""")


def test_a_product_larger_than_memory_raises_memory_error():
    """An output buffer that cannot grow inside a kernel (an OpenMP region, where a C++
    exception ends the process: session 30 saw SIGABRT) records the failure and the call
    raises MemoryError; the process goes on."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", PRODUCT_TOO_LARGE], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "MemoryError: out of memory while the kernel appended" in out.stdout
    assert "outer MemoryError: out of memory while the kernel appended" in out.stdout
    assert "alive 3.0" in out.stdout
