"""The price of one update of a wide sparse workspace (the cost model's
``work_estimate.MAP_WORKSPACE_VISITS``): CSC x CSR (10 entries a row) forced into the
outer-product order ``j, i, k``, where the whole product accumulates in one 2-D workspace,
at N = 2000 (dense scratch: extent 4M) and N = 20,000 (the runtime's ``SparseWorkspace``:
extent 4e8), 1 thread, beside the order the compiler chooses.

    python benchmarks/workspace_update_cost.py

Session 32 (Zen 5, two runs): 48-64 and 59-82 ns an update (the std::map before: ~570);
the chosen order 1.1 and 17 ms.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import order_oracle as oo  # noqa: E402
import scorch  # noqa: E402
import scorch.tensor_compiler as tc  # noqa: E402
from scorch.tensor_compiler import schedule  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    schedule.algorithm1 = oo._forced_algorithm1
    for n in (2000, 20000):
        g = torch.Generator().manual_seed(0)
        rows = torch.arange(n).repeat_interleave(10)
        cols = torch.randint(0, n, (10 * n,), generator=g)
        idx, v = torch.stack([rows, cols]), torch.rand(10 * n, dtype=torch.float64, generator=g)
        A = scorch.sparse_tensor((idx, v), size=(n, n), format="csc")
        B = scorch.sparse_tensor((idx, v), size=(n, n), format="csr")
        updates = int((torch.bincount(cols, minlength=n) * torch.bincount(rows, minlength=n)).sum())
        oo._FORCED = ("j", "i", "k")
        tc.plan_cache_clear()
        forced = oo.median_ms(lambda: scorch.einsum("ij,jk->ik", A, B), calls=5, budget_s=3)
        oo._FORCED = None
        tc.plan_cache_clear()
        chosen = oo.median_ms(lambda: scorch.einsum("ij,jk->ik", A, B), calls=5, budget_s=3)
        print(f"N={n}: forced j,i,k {forced:.1f} ms = {forced * 1e6 / updates:.1f} ns an update "
              f"({updates} updates); the chosen order {chosen:.2f} ms")


if __name__ == "__main__":
    main()
