"""Which torch ops still take the dense fallback (or raise) on a scorch sparse tensor: a
survey of ~280 calls a PyTorch user makes, each run once on small CSR operands, printing the
ones that warn "no sparse kernel" (``DENSE-FALLBACK``) or raise (``ERR``). Everything else
runs through a sparse handler. Dense-by-nature results (``ones_like``, ``cumsum``, ...) are
expected on the list; see docs/ops.md for how each op runs.

    python benchmarks/report_fallbacks.py
"""
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import scorch  # noqa: E402

warnings.simplefilter("always")
x = scorch.sparse_tensor(torch.randn(6, 5) * (torch.rand(6, 5) < 0.4), format="csr")
y = scorch.sparse_tensor(torch.randn(6, 5) * (torch.rand(6, 5) < 0.4), format="csr")
sq = scorch.sparse_tensor(torch.randn(6, 6) * (torch.rand(6, 6) < 0.4), format="csr")
d = torch.randn(6, 5)
ops = {
 "allclose": lambda: torch.allclose(x, y), "equal": lambda: torch.equal(x, x), "isclose": lambda: torch.isclose(x, y),
 "clamp": lambda: torch.clamp(x, -0.5, 0.5), "clamp_min": lambda: x.clamp(min=0.1), "nan_to_num": lambda: torch.nan_to_num(x),
 "where": lambda: torch.where(x > 0, x, y), "masked_fill": lambda: x.masked_fill(x > 0, 1.0),
 "abs": lambda: x.abs(), "pow": lambda: x.pow(2), "square": lambda: x.square(), "sqrt": lambda: x.abs().sqrt(),
 "exp": lambda: x.exp(), "log1p": lambda: x.abs().log1p(), "expm1": lambda: x.expm1(), "sin": lambda: x.sin(),
 "tanh": lambda: x.tanh(), "sigmoid": lambda: x.sigmoid(), "relu": lambda: x.relu(), "gelu": lambda: torch.nn.functional.gelu(x),
 "leaky_relu": lambda: torch.nn.functional.leaky_relu(x), "silu": lambda: torch.nn.functional.silu(x), "neg": lambda: -x,
 "sign": lambda: x.sign(), "floor": lambda: x.floor(), "ceil": lambda: x.ceil(), "round": lambda: x.round(), "trunc": lambda: x.trunc(),
 "frac": lambda: x.frac(), "reciprocal": lambda: x.reciprocal(), "rsqrt": lambda: x.rsqrt(),
 "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "div_dense": lambda: x / (d.abs() + 1), "add_dense": lambda: x + d,
 "maximum": lambda: torch.maximum(x, y), "minimum": lambda: torch.minimum(x, y), "fmax": lambda: torch.fmax(x, y),
 "sum": lambda: x.sum(), "sum0": lambda: x.sum(0), "mean": lambda: x.mean(), "mean1": lambda: x.mean(1), "amax": lambda: x.amax(1),
 "amin": lambda: x.amin(0), "max": lambda: x.max(), "min": lambda: x.min(), "prod": lambda: x.prod(1), "norm": lambda: x.norm(),
 "norm1": lambda: torch.linalg.vector_norm(x, 1), "var": lambda: x.var(), "std": lambda: x.std(1), "logsumexp": lambda: torch.logsumexp(x, 1),
 "argmax": lambda: x.argmax(1), "count_nonzero": lambda: torch.count_nonzero(x), "any": lambda: (x > 0).any(), "all": lambda: (x != 0).all(),
 "softmax": lambda: torch.softmax(x, 1), "log_softmax": lambda: torch.log_softmax(x, 1),
 "t": lambda: x.t(), "transpose": lambda: x.transpose(0, 1), "reshape": lambda: x.reshape(3, 10), "view": lambda: x.view(30),
 "flatten": lambda: x.flatten(), "unsqueeze": lambda: x.unsqueeze(0), "squeeze": lambda: x.unsqueeze(0).squeeze(0),
 "permute": lambda: x.permute(1, 0), "narrow": lambda: x.narrow(0, 1, 3), "index_select": lambda: x.index_select(0, torch.tensor([0, 2])),
 "getitem_row": lambda: x[2], "getitem_slice": lambda: x[1:4], "getitem_int_list": lambda: x[[0, 2]], "cat": lambda: torch.cat([x, y]),
 "stack": lambda: torch.stack([x, y]), "flip": lambda: x.flip(0), "roll": lambda: x.roll(1, 0), "repeat": lambda: x.repeat(2, 1),
 "expand": lambda: x.unsqueeze(0).expand(2, 6, 5), "tril": lambda: x.tril(), "triu": lambda: x.triu(), "diagonal": lambda: x[:5].diagonal(),
 "matmul_dense": lambda: x @ d.t(), "matmul_sparse": lambda: x @ y.t(), "mv": lambda: x @ torch.randn(5), "mm": lambda: torch.mm(x, d.t()),
 "addmm": lambda: torch.addmm(torch.zeros(6, 6), x, d.t()), "bmm": lambda: torch.bmm(x.unsqueeze(0), d.t().unsqueeze(0)),
 "outer": lambda: torch.outer(x[0], x[1]), "dot": lambda: torch.dot(x[0], x[1]), "kron": lambda: torch.kron(x, y),
 "einsum": lambda: torch.einsum("ij,ij->i", x, d), "tensordot": lambda: torch.tensordot(x, d, dims=([1], [1])),
 "to_float64": lambda: x.to(torch.float64), "double": lambda: x.double(), "int": lambda: x.int(), "bool": lambda: x.bool(),
 "clone": lambda: x.clone(), "detach": lambda: x.detach(), "contiguous": lambda: x.contiguous(), "zeros_like": lambda: torch.zeros_like(x),
 "ones_like": lambda: torch.ones_like(x), "full_like": lambda: torch.full_like(x, 2.0), "eq": lambda: x == y, "ne": lambda: x != 0, "gt": lambda: x > 0,
 "logical_and": lambda: torch.logical_and(x, y), "logical_not": lambda: torch.logical_not(x), "isnan": lambda: torch.isnan(x),
 "isfinite": lambda: torch.isfinite(x), "nonzero": lambda: x.nonzero(), "sort": lambda: torch.sort(x, 1), "topk": lambda: torch.topk(x, 2, 1),
 "cumsum": lambda: x.cumsum(1), "diff": lambda: torch.diff(x, dim=1), "sum_dim_keep": lambda: x.sum(1, keepdim=True),
 "dropout": lambda: torch.nn.functional.dropout(x, 0.5), "linear": lambda: torch.nn.functional.linear(d, x.t()[:5] if False else torch.randn(4,5), None),
 "linear_sparse_w": lambda: torch.nn.functional.linear(d, x), "mse": lambda: torch.nn.functional.mse_loss(x, y), "lerp": lambda: torch.lerp(x, y, 0.5),
 "addcmul": lambda: torch.addcmul(x, x, y), "masked_select": lambda: torch.masked_select(x, x > 0), "scatter_add": lambda: torch.zeros(6,5).scatter_add(0, torch.zeros(6,5,dtype=torch.long), x),
 "matrix_power": lambda: torch.linalg.matrix_power(x[:5], 2), "trace": lambda: torch.trace(x[:5]), "clip": lambda: x.clip(-1, 1),
 "hardtanh": lambda: torch.nn.functional.hardtanh(x), "elu": lambda: torch.nn.functional.elu(x), "softplus": lambda: torch.nn.functional.softplus(x),
 "erf": lambda: torch.erf(x), "atan": lambda: torch.atan(x), "heaviside": lambda: torch.heaviside(x, torch.tensor(0.)),
 "softsign": lambda: torch.nn.functional.softsign(x), "normalize": lambda: torch.nn.functional.normalize(x, dim=1),
 "layer_norm": lambda: torch.nn.functional.layer_norm(x, (5,)), "cross_entropy": lambda: torch.nn.functional.cross_entropy(x, torch.zeros(6, dtype=torch.long)),
}
ops.update({
 "sparse.addmm": lambda: torch.sparse.addmm(torch.zeros(6, 3), x, torch.randn(5, 3)),
 "sampled_addmm": lambda: torch.sparse.sampled_addmm(sq, torch.randn(6, 4), torch.randn(4, 6)),
 "addmv": lambda: torch.addmv(torch.zeros(6), x, torch.randn(5)),
 "baddbmm": lambda: torch.baddbmm(torch.zeros(1, 6, 3), x.unsqueeze(0), torch.randn(1, 5, 3)),
 "embedding_bag": lambda: F.embedding(torch.tensor([0, 2]), x),
 "sum_dtype": lambda: x.sum(dtype=torch.float64),
 "to_sparse_csr": lambda: x.to_sparse_csr(), "to_sparse_coo": lambda: x.to_sparse(), "to_sparse_csc": lambda: x.to_sparse_csc(),
 "coalesce": lambda: x.coalesce(), "is_coalesced": lambda: x.is_coalesced(), "crow_indices": lambda: x.crow_indices(),
 "col_indices": lambda: x.col_indices(), "sparse_mask": lambda: d.sparse_mask(x), "mul_scalar_tensor": lambda: x * torch.tensor(2.0),
 "pow_tensor": lambda: x ** torch.tensor(2.0), "div_floor": lambda: torch.div(x, 2, rounding_mode="floor"),
 "hspmm": lambda: torch.hspmm(x.to_torch() if False else x, torch.randn(5, 2)),
 "smm": lambda: torch.smm(x, torch.randn(5, 2)), "sspaddmm": lambda: torch.sspaddmm(x.t() @ x if False else sq, sq, torch.randn(6,6)),
 "matrix_exp": lambda: torch.matrix_exp(sq), "log_softmax_F": lambda: F.log_softmax(x, dim=-1),
 "prelu": lambda: F.prelu(x, torch.tensor([0.25])), "relu6": lambda: F.relu6(x), "mish": lambda: F.mish(x), "tanhshrink": lambda: F.tanhshrink(x),
 "softshrink": lambda: F.softshrink(x), "hardshrink": lambda: F.hardshrink(x), "threshold": lambda: F.threshold(x, 0.1, 0.0),
 "selu": lambda: F.selu(x), "celu": lambda: F.celu(x), "hardswish": lambda: F.hardswish(x), "logsigmoid": lambda: F.logsigmoid(x),
 "asin": lambda: torch.asin(x.clamp(-1, 1)), "sinh": lambda: torch.sinh(x), "asinh": lambda: torch.asinh(x), "atanh": lambda: torch.atanh(x.clamp(-0.5,0.5)),
 "tan": lambda: torch.tan(x), "deg2rad": lambda: torch.deg2rad(x), "signbit": lambda: torch.signbit(x), "sgn": lambda: torch.sgn(x),
 "positive": lambda: torch.positive(x), "conj": lambda: torch.conj(x), "real": lambda: torch.real(x),
})

# session 18: the calls of a wider survey (order statistics, positions, in-place activations,
# summaries, layout, value functions, more dense-by-nature ops)
idx = torch.randint(0, 5, (6, 5))
more = {
 "gather": lambda: torch.gather(x, 1, idx), "take": lambda: torch.take(x, torch.tensor([0, 7, 12])),
 "take_along_dim": lambda: torch.take_along_dim(x, idx, 1), "index_add": lambda: torch.zeros(6, 5).index_add(0, torch.arange(6), x),
 "index_add_sparse": lambda: x.index_add(0, torch.arange(6), y), "kthvalue": lambda: torch.kthvalue(x, 2, 1),
 "median": lambda: x.median(), "median_dim": lambda: x.median(1), "nanmedian": lambda: x.nanmedian(0), "msort": lambda: torch.msort(x),
 "argsort": lambda: torch.argsort(x, 1), "unique": lambda: torch.unique(x), "bincount": lambda: torch.bincount(x.abs().mul(3).long().flatten()),
 "histc": lambda: torch.histc(x), "where_1arg": lambda: torch.where(x), "linalg_norm": lambda: torch.linalg.norm(x), "cdist": lambda: torch.cdist(x, d),
 "cosine_similarity": lambda: F.cosine_similarity(x, d), "pairwise_distance": lambda: F.pairwise_distance(x, d),
 "gelu_tanh": lambda: F.gelu(x, approximate="tanh"), "erfinv": lambda: x.clamp(-0.5, 0.5).erfinv(), "log2": lambda: x.abs().log2(),
 "xlogy": lambda: torch.xlogy(x, d.abs()), "hypot": lambda: torch.hypot(x, y), "atan2": lambda: torch.atan2(x, d),
 "copysign": lambda: torch.copysign(x, d), "logaddexp": lambda: torch.logaddexp(x, y), "float_power": lambda: torch.float_power(x, 2),
 "clamp_tensor": lambda: torch.clamp(x, min=torch.zeros(6, 5)), "std_mean": lambda: torch.std_mean(x, 1), "var_mean": lambda: torch.var_mean(x),
 "aminmax": lambda: torch.aminmax(x), "nansum": lambda: torch.nansum(x), "nanmean": lambda: torch.nanmean(x), "dist": lambda: torch.dist(x, y),
 "chunk": lambda: x.chunk(2), "split": lambda: x.split(2), "split_sizes": lambda: torch.split(x, [2, 4]), "unbind": lambda: x.unbind(0),
 "tensor_split": lambda: x.tensor_split(3), "new_zeros": lambda: x.new_zeros(3, 3), "index_fill": lambda: x.index_fill(1, torch.tensor([0]), 0.0),
 "diag_embed": lambda: torch.diag_embed(x), "diagflat": lambda: torch.diagflat(x[0]), "diag_offset": lambda: torch.diag(x, 1),
 "block_diag": lambda: torch.block_diag(x, y), "tile": lambda: x.tile(2), "select": lambda: x.select(1, 2),
 "relu_": lambda: x.clone().relu_(), "abs_": lambda: x.clone().abs_(), "clamp_": lambda: x.clone().clamp_(-0.1, 0.1),
 "F.relu_inplace": lambda: F.relu(x.clone(), inplace=True), "square_": lambda: x.clone().square_(),
 "glu": lambda: F.glu(x[:, :4]), "softmin": lambda: F.softmin(x, 1), "dropout1d": lambda: F.dropout1d(x.unsqueeze(0), 0.5),
 "alpha_dropout": lambda: F.alpha_dropout(x, 0.5, True), "batch_norm": lambda: F.batch_norm(x, None, None, training=True),
 "group_norm": lambda: F.group_norm(x, 1), "embedding_bag_sparse": lambda: F.embedding_bag(torch.tensor([[0, 2]]), x),
 "pad": lambda: F.pad(x, (1, 1)), "hinge_loss": lambda: F.hinge_embedding_loss(x, d), "soft_margin": lambda: F.soft_margin_loss(x, d),
 "max_dim": lambda: x.max(1), "min_dim": lambda: x.min(0), "max_binary": lambda: torch.max(x, d), "sparse_dim": lambda: x.sparse_dim(),
 "invert": lambda: ~(x > 0), "rpow": lambda: 2 ** x, "scatter": lambda: torch.zeros(6, 5).scatter(0, idx, x),
 "masked_fill_0": lambda: x.clone().masked_fill_(x < 0, 0.0), "setitem_mask": lambda: x.clone().__setitem__(x < 0, 0.0),
 "index_put": lambda: x.index_put((torch.tensor([0]), torch.tensor([1])), torch.tensor(5.0)),
 "fill_diagonal_": lambda: sq.clone().fill_diagonal_(0), "is_pinned": lambda: x.is_pinned(),
 "svdvals": lambda: torch.linalg.svdvals(x), "eigvalsh": lambda: torch.linalg.eigvalsh(sq + sq.t()),
 "qr": lambda: torch.linalg.qr(x), "matrix_norm_1": lambda: torch.linalg.matrix_norm(x, 1),
 "linalg_norm_nuc": lambda: torch.linalg.norm(x, "nuc"),
 "to_sparse_bsr": lambda: x.to_sparse_bsr((2, 1)), "to_sparse_layout": lambda: x.to_sparse(layout=torch.sparse_csc),
 "new_ones": lambda: x.new_ones(2, 2), "empty_like": lambda: torch.empty_like(x), "rand_like": lambda: torch.rand_like(x),
 "sum_to_size": lambda: x.sum_to_size(1, 5), "bernoulli": lambda: torch.bernoulli(x.abs().clamp(max=1)),
 "_values": lambda: x._values(), "dense.copy_": lambda: torch.zeros(6, 5).copy_(x),
 "unfold": lambda: x.unfold(1, 2, 1), "cartesian_prod": lambda: torch.cartesian_prod(x[0], x[1]),
 "renorm": lambda: torch.renorm(x, 2, 0, 0.5), "cross": lambda: torch.linalg.cross(x[:, :3], y[:, :3]),
 "masked_scatter": lambda: x.masked_scatter(d > 0, torch.randn(30)), "mode": lambda: torch.mode(x, 1),
 "embedding_bag_max": lambda: F.embedding_bag(torch.tensor([[0, 2]]), x, mode="max"),
}
ops.update({k: v for k, v in more.items() if k not in ops})


def main() -> None:
    listed = 0
    from scorch import _dispatch
    for name, f in ops.items():
        _dispatch._warned.clear()          # the fallback warns once per op: ask afresh each call
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                f()
                status = ""
            except Exception as e:   # noqa: BLE001  (a survey: every failure is reported)
                status = f"ERR {type(e).__name__}: {str(e)[:110]}"
            fallback = any("no sparse kernel" in str(w.message) for w in caught)
        if fallback or status:
            listed += 1
            print(f"{name:16s} {'DENSE-FALLBACK ' if fallback else ''}{status}")
    print(f"{listed} of {len(ops)} calls fall back or raise")


if __name__ == "__main__":
    main()
