import numpy as np, sys
for name in sys.argv[1:]:
    with open(f"/tmp/s20/{name}.bin","rb") as f:
        m, n, nnz = np.fromfile(f, np.int64, 3); pos = np.fromfile(f, np.int32, m+1); crd = np.fromfile(f, np.int32, nnz)
    L = np.diff(pos)
    change = np.mean(L[1:] != L[:-1])
    # column locality: mean |crd - row| relative? use median jump between consecutive entries of consecutive rows
    rows = np.repeat(np.arange(m), L)
    dist = np.median(np.abs(crd.astype(np.int64) - rows * (n / m)))
    print(f"{name:20} avg {nnz/m:5.1f} std {L.std():5.1f} change {change:.2f} empty {np.mean(L==0):.2f} xKB {n*4/1024:7.0f} meddist {dist:9.0f}")
