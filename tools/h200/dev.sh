#!/bin/bash
# Device side of the H200 record (tools/h200/README.md): bash .h200/h200/dev.sh PHASE WALL_S [RERUN]
# Phase 1 unpacks the SGLang 0.5.17 site dir and the guard, runs the guard's checks and the
# lines that need no FA3; phase 2 adds flash_ops (FA3) and runs the rest. /tmp/h23 holds the
# state between the two runs (the machine keeps it while warm); $OUT gets what comes back.
# With RERUN=1 (the second session: every guarded run again, with the guard of then) each
# phase runs the cases whose `rerun` is the phase instead, and phase 2 runs no checks.
set -u
P=$1; WALL=$2; RERUN=${3:-0}
SEL="--phase $P"; [ "$RERUN" = 1 ] && SEL="--phase $P --rerun $P"
H=$(cd "$(dirname "$0")/.." && pwd); T=/tmp/h23
mkdir -p $T
export PYTHONPATH=$T/guard:$T/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "$P" = 1 ]; then
  t=$(date +%s); tar -C $T -xJf $H/site.tar.xz || exit 3; echo "site unpacked in $(( $(date +%s) - t ))s"
  python3 -m pip install -q --no-index --no-deps --no-compile --target $T/guard $H/guard/*.whl || exit 4
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv | tee $OUT/gpu.csv
  python3 -c "import sglang, sgl_kernel, flashinfer, transformers, torch; print('sglang', sglang.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'flashinfer', flashinfer.__version__)" 2>&1 | tail -3 | tee $OUT/versions.txt
  timeout $WALL python3 $H/h200/serve_matrix.py $H/h200/gpu-cases.jsonl $H/models $T/out1 --checks 3 > $T/checks.log 2>&1 &
  CK=$!
  python3 $H/h200/serve_matrix.py $H/h200/gpu-cases.jsonl $H/models $T/out1 $SEL --wall $WALL
  wait $CK; tail -3 $T/checks.log
  cp $T/out1/checks.jsonl $OUT/ 2>/dev/null
else
  t=$(date +%s)
  python3 - "$H/fa3a.so.zst" "$T/site/sgl_kernel/flash_ops.abi3.so" <<'PY' || exit 5
import sys, zstandard
with open(sys.argv[1], "rb") as src, open(sys.argv[2], "wb") as dst:
    zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(src, dst)
PY
  echo "flash_ops unpacked in $(( $(date +%s) - t ))s"
  python3 -c "import torch; from sgl_kernel import flash_ops; print('flash_ops ok')" 2>&1 | tail -2
  if [ "$RERUN" = 1 ]; then
    python3 $H/h200/serve_matrix.py $H/h200/gpu-cases.jsonl $H/models $T/out$P $SEL --wall $WALL
  else
    python3 $H/h200/serve_matrix.py $H/h200/gpu-cases.jsonl $H/models $T/out$P --checks 2 > $T/checks.log 2>&1 &
    CK=$!
    python3 $H/h200/serve_matrix.py $H/h200/gpu-cases.jsonl $H/models $T/out$P --phase $P --wall $WALL --also $T/out1/raw-1.jsonl
    wait $CK; tail -3 $T/checks.log; cp $T/out$P/checks.jsonl $OUT/ 2>/dev/null
  fi
fi
cp $T/out$P/raw-$P.jsonl $OUT/
tar -C $T/out$P -cJf $OUT/logs-$P.tar.xz logs
ls -la $OUT
