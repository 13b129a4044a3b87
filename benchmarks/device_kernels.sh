#!/bin/bash
# Kernel figures at 1-16 threads on the lent 16-core machine (issue 15), in two calls that
# fit a 15-minute lease: `bash benchmarks/device_kernels.sh OUTDIR 1` builds the runtime and
# measures SpMV (with STREAM); `... OUTDIR 2` (machine still warm, or it rebuilds) measures
# SpMM, SDDMM (both layouts of C) and SpGEMM; `... OUTDIR 3` runs the follow-up measurements
# (SpMV variants with and without vector gathers; SDDMM's copy of C at 1-16 threads; small
# calls at 4-16 threads with SCORCH_WORK_PER_THREAD 0 / 16000 / 48000; SpMM register rows
# with one or two FMA chains: a C prototype, then through scorch.einsum with
# results/issue15/zen3-s15/entry_pairs.patch applied for the run). Matrices are read from ./devdata/matrices
# (a copy of ../shared/data/matrices, carried: the shared folder does not travel). Each
# group is capped by `timeout`; report_kernels.py writes kernels.json after every case, so
# a capped group keeps what it finished. Render locally with
#   python benchmarks/report_kernels.py --from-json OUTDIR/<group>/kernels.json --out DIR
set -u
out=${1:?outdir}; part=${2:-1}
if ! ls devdata/matrices/*.mtx.gz >/dev/null 2>&1; then
  echo "devdata/matrices/ is empty: before the call, here: mkdir -p devdata/matrices &&" \
       "cp ../shared/data/matrices/*.mtx.gz devdata/matrices/ && echo /devdata/ >> .git/info/exclude;" \
       "then run with carry [\"devdata\"]" >&2
  exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SCORCH_CACHE_DIR=/tmp/scorch-cache SCORCH_DATA_DIR=$PWD/devdata
export PYTHONPATH=$PWD
log=$out/log$part.txt
exec > >(tee -a "$log") 2>&1
t0=$(date +%s)
if ! ls scorch/_runtime/*.so >/dev/null 2>&1; then
  { lscpu; nproc; free -g; gcc --version | head -1
    python3 -c "import sys,torch,numpy,scipy,Cython,sysconfig,os;print(sys.version,torch.__version__,numpy.__version__,scipy.__version__,Cython.__version__,os.path.exists(sysconfig.get_paths()['include']+'/Python.h'))"
  } > "$out/machine.txt" 2>&1
  grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|Flags" "$out/machine.txt" | cut -c1-300
  SCORCH_SKIP_PREBUILT=1 python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 \
    || { tail -40 /tmp/build.log; cp /tmp/build.log "$out/"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
python3 - <<'PY' || exit 1
import torch, scorch
from scorch.tensor_compiler.target import current
A = torch.rand(300, 200); A[A < 0.9] = 0
S = scorch.sparse_tensor(A, format="csr"); B = torch.rand(200, 48)
err = (scorch.einsum("ij,jk->ik", S, B) - A @ B).abs().max().item()
print("target", current().name, "spmm err", err); assert err < 1e-4
PY
common="--threads ${THREADS:-1 2 4 8 16} --target 0.12 --runs 3 --retries 0 --quiet-wait 0 --no-plot"
peers="--impls scorch torch_csr torch_csr64 scipy"
group() {  # name seconds args...
  local name=$1 secs=$2; shift 2
  echo "== $name (cap $secs s) at $(( $(date +%s) - t0 )) s"
  timeout "$secs" python3 benchmarks/report_kernels.py "$@" --out "$out/$name" > "$out/$name.log" 2>&1
  echo "rc=$?"; grep -E "ratio=" "$out/$name.log" | sed 's/  load=.*(/ (/' | cut -c1-200
  rm -f "$out/$name/kernels.md"; mv "$out/$name.log" "/tmp/$name.log"
}
if [ "$part" = 1 ]; then
  group spmv 200 --kernels spmv $peers $common --matrices ${SPMV_MATRICES:-uniform21 NotreDame_www \
    copter2 Groebner_id2003_aug mdual rmat18 uniform18 4elt}
elif [ "$part" = 3 ]; then   # follow-ups of session 14's run (results/issue15/spr16-s14)
  echo "== SpMV variants, 1 thread (hardware gathers on this CPU?)"
  timeout 150 python3 benchmarks/bench_spmv_paths.py --rounds 5 --matrices copter2 uniform18 \
    rmat18 NotreDame_www mdual 4elt Groebner_id2003_aug > "$out/spmv_paths.txt" 2>&1
  echo "rc=$?"; cat "$out/spmv_paths.txt"
  echo "== SDDMM C as K x n: the copy of C at 1-16 threads"
  timeout 120 python3 benchmarks/bench_relayout_threads.py --threads ${THREADS:-1 2 4 8 16} \
    > "$out/relayout_threads.txt" 2>&1
  echo "rc=$?"; cat "$out/relayout_threads.txt"
  echo "== the same copy's tile shapes at 1 thread (16-128 source rows x 256-2048 columns)"
  timeout 60 python3 benchmarks/results/issue15/zen3-s15/prototypes/tile_ab.py 2>&1 | grep -v compiling \
    | tee "$out/relayout_tiles.txt"
  # small calls at many threads: a least work per thread (threads.WORK_PER_THREAD) or not
  for wpt in 0 16000 48000; do
    SCORCH_WORK_PER_THREAD=$wpt group wpt$wpt 80 --kernels spmv spmm $peers --no-stream \
      --threads 4 8 16 --target 0.12 --runs 3 --retries 0 --quiet-wait 0 --no-plot \
      --matrices 4elt Groebner_id2003_aug bcspwr10
  done
  # session 15: does a 1-2 vector register row wait on FMA latency on this core? (SpMM with
  # one / two accumulator chains per vector: C prototype, results/issue15/zen3-s15)
  echo "== SpMM register rows, one or two chains, 1 thread"
  proto=benchmarks/results/issue15/zen3-s15/prototypes
  if [ -f $proto/spmm.c ]; then
    PROTO_DATA=/tmp/proto timeout 60 python3 $proto/export.py Groebner_id2003_aug,copter2,4elt,bcspwr10 \
      > /dev/null 2>&1; echo "export rc=$?"
    for cfg in "64 16" "64 32" "32 8" "32 16" "32 32"; do read -r vb k <<< "$cfg"   # vector bytes, K
      gcc -O3 -march=native -mtune-ctrl=^use_gather -DVB=$vb -DK=$k -o /tmp/spmm_${vb}_$k $proto/spmm.c -lm \
        && for m in Groebner_id2003_aug copter2 4elt bcspwr10; do timeout 30 /tmp/spmm_${vb}_$k /tmp/proto/$m 15; done
    done 2>&1 | tee "$out/spmm_chains.txt"
    # the same through scorch.einsum: entry_pairs.patch applied, pairs on / off in one process
    zen=benchmarks/results/issue15/zen3-s15
    if (git apply $zen/entry_pairs.patch 2>/dev/null || patch -p1 -s < $zen/entry_pairs.patch); then
      timeout 90 python3 $zen/ab_pairs.py Groebner_id2003_aug,copter2,4elt,rmat18 16,32 7 1 2>&1 \
        | grep -v "compiling" | tee "$out/spmm_pairs.txt"
      git apply -R $zen/entry_pairs.patch 2>/dev/null || patch -p1 -R -s < $zen/entry_pairs.patch
    fi
  fi
else
  group spmm 110 --kernels spmm $peers $common --no-stream \
    --matrices copter2 NotreDame_www rmat18 4elt Groebner_id2003_aug
  group sddmm 120 --kernels sddmm sddmm_nk --impls scorch torch_csr torch_csr64 $common \
    --no-stream --matrices copter2 rmat18 4elt Groebner_id2003_aug
  export SCORCH_BENCH_SPGEMM_MAX_FLOPS=5e8
  group spgemm 90 --kernels spgemm $peers $common \
    --no-stream --matrices 4elt Groebner_id2003_aug copter2 mdual uniform16 NotreDame_www
fi
echo "done at $(( $(date +%s) - t0 )) s"
