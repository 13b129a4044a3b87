"""Conversions and transposes cost O(nnz + dims of dense levels): dimensions of 2^33 with a
few hundred entries convert under an address-space limit (RLIMIT_AS) a little above what
the result itself needs. Each case runs with its own budget over the
child's address space at the start of the case (one child runs them all)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import scorch

CHILD = textwrap.dedent(r'''
    import gc, json, resource, sys
    import torch, scorch

    def vmsize():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024

    def coords_and_values(t):
        idx = t.indices()
        return sorted(zip(map(tuple, idx.t().tolist()), t.values().tolist()))

    g = torch.Generator().manual_seed(0)
    MB = 1 << 20
    N = 2 ** 33

    def entries(sizes, n=300):
        idx = torch.stack([torch.randint(0, s, (n,), generator=g) for s in sizes])
        return idx, torch.rand(n, generator=g)

    def dcsr_to_dcsc():
        size = (N, 2 ** 28)
        idx, vals = entries(size)
        s = scorch.sparse_tensor((idx, vals), size=size, format="dcsr")
        t = s.to_format("dcsc")
        back = t.to_format("dcsr")
        coo = t.to_format("coo")
        want = coords_and_values(s)
        return want == coords_and_values(t) == coords_and_values(back) == coords_and_values(coo)

    def transpose_view_to_dcsr():
        size = (N, 2 ** 28)
        idx, vals = entries(size)
        s = scorch.sparse_tensor((idx, vals), size=size, format="dcsr")
        t = s.t().to_format("dcsr")           # a transposed view re-laid out
        return coords_and_values(t) == sorted((c[::-1], v) for c, v in coords_and_values(s))

    def csf_3d():
        size = (N, 2 ** 15, 2 ** 14)
        idx, vals = entries(size)
        s = scorch.sparse_tensor((idx, vals), size=size, format="csf")
        t = s.to_format(scorch.Format("ccc", (2, 0, 1)))
        return coords_and_values(s) == coords_and_values(t.to_format("coo"))

    def wide_csr_to_csc():
        # the CSC keeps one pos array over the 2^26 columns (256 MB of int32): nothing more
        size = (64, 2 ** 26)
        idx, vals = entries(size)
        s = scorch.sparse_tensor((idx, vals), size=size, format="csr")
        t = s.to_format("csc")
        return coords_and_values(s) == coords_and_values(t) and t.index_dtype == torch.int32

    def cd_format():
        # 300 stored rows of 2^16 dense columns: 75 MB of values, and no index per position
        size = (N, 2 ** 16)
        idx, vals = entries(size)
        s = scorch.sparse_tensor((idx, vals), size=size, format="dcsr")
        t = s.to_format("cd")
        rows = t._storage.levels[0].crd.to(torch.int64)
        if s.nnz != 300 or t.nnz != rows.numel() * 2 ** 16:
            return False
        at = torch.searchsorted(rows, idx[0]) * 2 ** 16 + idx[1]   # where cd puts each entry
        flat = t._storage.values      # every stored value (values() is torch's hybrid (rows, 2^16))
        return bool(torch.equal(flat[at], vals)) and int(torch.count_nonzero(flat)) == 300

    cases = {"dcsr_to_dcsc": (dcsr_to_dcsc, 256), "transpose_view_to_dcsr": (transpose_view_to_dcsr, 256),
             "csf_3d": (csf_3d, 256), "wide_csr_to_csc": (wide_csr_to_csc, 256 + 144),
             "cd_format": (cd_format, 75 + 75)}
    report = {}
    for name, (fn, budget_mb) in cases.items():
        gc.collect()
        limit = vmsize() + budget_mb * MB
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        try:
            ok, err = fn(), None
        except MemoryError as exc:
            ok, err = False, f"MemoryError: {exc}"
        except RuntimeError as exc:
            ok, err = False, f"RuntimeError: {str(exc)[:300]}"
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        report[name] = {"ok": ok, "error": err, "budget_mb": budget_mb}
    print(json.dumps(report))
''')

CASES = ["dcsr_to_dcsc", "transpose_view_to_dcsr", "csf_3d", "wide_csr_to_csc", "cd_format"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Every case, each under its own budget, in one child (one torch import)."""
    script = tmp_path_factory.mktemp("large") / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-W", "ignore", str(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_conversion_under_memory_limit(case, report):
    assert report[case]["ok"], report[case]


@pytest.mark.parametrize("fa, fb", [("dcsc", "dcsr"), ("dcsr", "dcsr")])
def test_hypersparse_product_whose_workspace_extent_is_2_to_62(fa, fb):
    """A 2**31 x 2**31 product: the outer-product order's workspace spans i x k = 2**62
    positions, which int64 keys index (a std::map holds only those touched)."""
    n = 2 ** 31
    i = torch.tensor([[0, 5, n - 1, 123], [n - 1, 3, 0, 987]])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    A = scorch.sparse_tensor((i, v), size=(n, n), format=fa)
    B = scorch.sparse_tensor((i, v), size=(n, n), format=fb)
    C = (A @ B).to_torch()
    C = (C if C.layout == torch.sparse_coo else C.to_sparse()).coalesce()
    assert C.indices().tolist() == [[0, n - 1], [0, n - 1]] and C.values().tolist() == [3.0, 3.0]


@pytest.mark.parametrize("fmt", ["dcsr", "coo"])
def test_spgemm_backward_of_hypersparse_operands(fmt):
    """The gradient of ``A @ B.t()`` for 2^31 x 2^31 operands with a few hundred entries:
    the partner is located (a dense level of pointers) only while those pointers stay few
    (``pattern.located_format``); here they would have taken 17 GB, so the kernel
    intersects instead. A's gradient equals the dense one of the same entries packed into
    a 30 x 30 problem."""
    g = torch.Generator().manual_seed(0)
    n, scale = 2 ** 31, 2 ** 25

    def entries(seed):
        m = torch.rand(30, 30, generator=torch.Generator().manual_seed(seed)) < 0.15
        idx = m.nonzero().t()
        return idx, torch.rand(idx.shape[1], dtype=torch.float64, generator=g) + 0.5
    (ia, va), (ib, vb) = entries(1), entries(2)
    A = scorch.sparse_tensor((ia * scale, va), size=(n, n), format=fmt, requires_grad=True)
    B = scorch.sparse_tensor((ib * scale, vb), size=(n, n), format=fmt)
    C = A @ B.t()
    C.values().sum().backward()
    a = torch.sparse_coo_tensor(ia, va, (30, 30)).to_dense().requires_grad_()
    b = torch.sparse_coo_tensor(ib, vb, (30, 30)).to_dense()
    (a @ b.t()).sum().backward()
    got = A.grad.to_format("coo")
    gi = got.indices() // scale
    assert torch.allclose(torch.sparse_coo_tensor(gi, got.values(), (30, 30)).to_dense(),
                          a.grad * (a != 0))


def test_index_add_and_scatter_add_beyond_2_to_60_elements():
    """``index_add`` / ``scatter_add`` into a 2^31 x 2^31 sparse tensor: torch's shape
    checks on meta tensors overflowed their byte count ("Storage size calculation
    overflowed"); past 2^56 elements the same rules are checked by hand."""
    n = 2 ** 31
    idx = torch.tensor([[0, 5, n - 1], [1, 7, n - 2]])
    A = scorch.sparse_tensor((idx, torch.tensor([1.0, 2.0, 3.0])), size=(n, n), format="coo")
    B = A.index_add(0, torch.tensor([0, 1]), A[:2])
    assert B.nnz == 3 and B[0, 1].item() == 2.0
    C = A.scatter_add(0, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, 1))
    assert C[0, 0].item() == 1.0 and C.nnz == 4
    with pytest.raises(RuntimeError, match="do not match"):
        A.index_add(0, torch.tensor([0, 1, 2]), A[:2])


def test_per_fiber_norms_of_a_hypersparse_matrix():
    """``F.normalize``, ``renorm`` and ``F.rms_norm`` of a 2^31 x 2^31 matrix with a few
    entries keep one slot per stored fiber (a dense vector of norms had needed 16 GiB);
    values equal those of the same entries packed into a 30 x 30 matrix."""
    n, scale = 2 ** 31, 2 ** 25
    m = torch.rand(30, 30, generator=torch.Generator().manual_seed(3)) < 0.1
    idx = m.nonzero().t()
    vals = torch.rand(idx.shape[1], dtype=torch.float64) + 0.5
    small = torch.sparse_coo_tensor(idx, vals, (30, 30)).to_dense()
    S = scorch.sparse_tensor((idx * scale, vals), size=(n, n), format="dcsr")
    rms = small * torch.rsqrt((small ** 2).sum(1, keepdim=True) / n + 1e-6)   # the mean over n
    cases = [(lambda a: torch.nn.functional.normalize(a, dim=1), None),
             (lambda a: torch.nn.functional.normalize(a, p=1.0, dim=0), None),
             (lambda a: torch.renorm(a, 2, 0, 0.7), None),
             (lambda a: torch.nn.functional.rms_norm(a, (a.shape[1],), eps=1e-6), rms)]
    for f, want in cases:
        got = f(S).to_format("coo")
        want = f(small) if want is None else want
        packed = torch.sparse_coo_tensor(got.indices() // scale, got.values(), (30, 30))
        assert torch.allclose(packed.to_dense(), want * (small != 0))
