"""Relayout with streaming (non-temporal) stores vs normal stores, A/B in one process:
the copy alone and SDDMM K x n end to end (scorch.einsum), 1 thread."""
import sys, time, statistics, numpy as np, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb, scorch
from scorch.tensor_compiler import relayout as RL
from scorch.tensor_compiler.api import plan_cache_clear
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
K = int(sys.argv[3]) if len(sys.argv) > 3 else 128
orig = RL._SRC
nt = orig.replace("static inline void scorch_tr_float(const float* s, int64_t sr, float* d, int64_t dr) {{",
                  "static inline void scorch_tr_float(const float* s, int64_t sr, float* d, int64_t dr) {{\n    #define _mm256_storeu_ps(p, v) _mm256_stream_ps(p, v)")
nt = nt.replace("    #else\n        for (int c = 0; c < 8; c++)", "    #undef _mm256_storeu_ps\n    #else\n        for (int c = 0; c < 8; c++)", 1)
assert nt != orig
# streaming stores need 32-byte aligned rows: only K % 8 == 0 and an aligned buffer here (the prototype asserts it)
nt = nt.replace("                r0 = r0 + {TR}\n", "                r0 = r0 + {TR}\n    _mm_sfence_()\n")
nt = nt.replace("    void scorch_tr_{ct}(const {ct}* s, int64_t sr, {ct}* d, int64_t dr) noexcept nogil",
                "    void scorch_tr_{ct}(const {ct}* s, int64_t sr, {ct}* d, int64_t dr) noexcept nogil\n    void _mm_sfence_ \"_mm_sfence\"() noexcept nogil")
nt = nt.replace("                    tile(s, d, r0, min(r0 + {TR}, R), c0, min(c0 + {TC}, C), sr, sc, R)\n    else:",
                "                    tile(s, d, r0, min(r0 + {TR}, R), c0, min(c0 + {TC}, C), sr, sc, R)\n        _mm_sfence_()\n    else:")
_eo = RL.empty_output
def aligned_empty(shape, dtype):
    n = 1
    for d in shape: n *= d
    b = _eo((n + 16,), dtype)
    off = (-(b.data_ptr() % 64) // b.element_size()) % 16
    return b[off:off + n].view(shape)
RL.empty_output = aligned_empty
srcs = {"normal": orig, "stream": nt}
def use(name):
    RL._SRC = srcs[name]; RL._kernels.clear(); plan_cache_clear()
for m in sys.argv[1].split(","):
    A = kb.load_matrix(m); rng = np.random.default_rng(0)
    S = scorch.from_scipy(A)
    B = torch.from_numpy(rng.standard_normal((A.shape[0], K), dtype=np.float32))
    Ckn = torch.from_numpy(rng.standard_normal((K, A.shape[1]), dtype=np.float32))
    want = None
    times = {(n, w): [] for n in srcs for w in ("copy", "sddmm")}
    for r in range(6):
        for n in (("normal", "stream") if r % 2 == 0 else ("stream", "normal")):
            use(n)
            got = scorch.einsum('ij,ik,kj->ij', S, B, Ckn)
            v = got.values() if hasattr(got, "values") else got
            if want is None: want = v.clone()
            assert torch.allclose(v, want, rtol=1e-4, atol=1e-3), n
            for _ in range(3):
                a = time.perf_counter(); RL.relayout(Ckn, (1, 0), (1, 0), lambda e: torch.get_num_threads()); times[(n, "copy")].append(time.perf_counter() - a)
                a = time.perf_counter(); scorch.einsum('ij,ik,kj->ij', S, B, Ckn); times[(n, "sddmm")].append(time.perf_counter() - a)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{m} K={K} T={torch.get_num_threads()}: copy normal {med[('normal','copy')]:.2f} stream {med[('stream','copy')]:.2f} ms; "
          f"sddmm normal {med[('normal','sddmm')]:.2f} stream {med[('stream','sddmm')]:.2f} ms ({med[('normal','sddmm')]/med[('stream','sddmm')]:.2f}x)", flush=True)
use("normal")
