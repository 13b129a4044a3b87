"""Scorch in a minute: a real matrix, converted to CSR, multiplied by a dense matrix and a
sparse mask, with results checked against dense torch.

    python examples/demo.py [--matrix NAME] [--data-dir DIR]
"""
import argparse
import time

import scorch as torch
from scorch.datasets import load_matrix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", default="bcspwr10")
    parser.add_argument("--data-dir", default=None, help="folder with matrices/ (default: $SCORCH_DATA_DIR or ../shared/data)")
    args = parser.parse_args()

    m = load_matrix(args.matrix, args.data_dir)
    A = torch.from_scipy(m)                      # shares scipy's arrays, no copy
    print(f"loaded {args.matrix}: {A}")
    A = A.to_format("csr")
    print(f"as CSR:     {A}")
    print(f"as CSC:     {A.to_format('csc')}")

    n = A.shape[1]
    X = torch.randn(n, 16)
    t0 = time.perf_counter()
    Y = torch.einsum("ij,jk->ik", A, X)          # SpMM: compiled on first use, then cached
    t1 = time.perf_counter()
    Y = torch.einsum("ij,jk->ik", A, X)
    t2 = time.perf_counter()
    print(f"SpMM A @ X: result {tuple(Y.shape)} {type(Y).__name__} "
          f"(first call {1e3 * (t1 - t0):.0f} ms incl. compile, warm {1e3 * (t2 - t1):.2f} ms)")

    B, C = torch.randn(A.shape[0], 8), torch.randn(8, n)
    S = torch.einsum("ij,ik,kj->ij", A, B, C)    # SDDMM: sparse like A, never forms B @ C
    print(f"SDDMM A * (B @ C): {S}")

    plan = torch.explain("ij,jk->ik", A, X)
    print(f"plan: loop order {plan.loop_order}, output format {plan.output_format}")

    dense = torch.from_numpy(m.toarray())
    ok = torch.allclose(Y, dense @ X, rtol=1e-4, atol=1e-4) and \
        torch.allclose(S.to_dense(), dense * (B @ C), rtol=1e-4, atol=1e-4)
    print("matches dense torch:", ok)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
