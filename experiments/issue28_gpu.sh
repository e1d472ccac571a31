#!/bin/bash
# Issue 28's GPU table in one call (about 8 minutes on an H200), from the repository root:
#   PFLLIB=/path/to/PFLlib OUT=/tmp/gpu28 bash experiments/issue28_gpu.sh
# PART=conv (a second call, about 3 minutes): P2's open lead. P2 is bound by the batched step's vmapped
# (grouped) convolutions, 3.18 ms per captured step over 50 clients on an H200, and needs about 1.9 ms for
# 30x; untried there: cuDNN's timed algorithm choice (--cudnn_benchmark) and channels-last (--conv_layout).
# PFLLIB: a PFLlib checkout (its system/main.py runs P1 beside ours; unset: our runs only).
# P1's MNIST folder is generated into dataset/benchmark first (benchmark.py --mnist-raw DIR, or kept
# from an earlier run). Logs and JSON per table in $OUT.
set -u
OUT=${OUT:-/tmp/gpu28}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1; PY=${PY:-python3}
LOG="$OUT/run.log"; T0=$(date +%s)
say() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
$PY -c "import torch,sys; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$LOG"
cd system
if [ "${PART:-main}" = conv ]; then
  say "P2: sequential and batched, cuDNN benchmark and layout variants, one process"
  timeout 150 $PY benchmark.py --device cuda --warmup 1 --only P2 --rounds 5 --timeout 60 --out "$OUT/p2conv.json" \
    --engines sequential batched batched+cudnnbench batched+nhwc batched+cudnnbench+nhwc > "$OUT/p2conv.log" 2>&1
  echo "rc=$?" | tee -a "$LOG"; grep -E "speed-up|^P2 " "$OUT/p2conv.log" | tee -a "$LOG"
  cd ..
  for variant in "0 auto" "1 auto" "0 channels_last" "1 channels_last"; do
    set -- $variant; say "per-step cost at P2's shape: cudnn.benchmark=$1, layout $2"
    SB_CUDNN_BENCHMARK=$1 SB_LAYOUT=$2 SB_CLIENTS=50 SB_SHAPE=3,32,32 SB_RUNNERS="eager graph" timeout 45 \
      $PY experiments/issue28_stepbench.py cuda 2>&1 | grep -v Warning | tee -a "$LOG"
  done
  say done; exit 0
fi
bench() {  # name timeout benchmark.py flags...
  local name=$1 t=$2; shift 2; say "$name"
  timeout $t $PY benchmark.py --device cuda --warmup 1 --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$?" | tee -a "$LOG"; grep -E "speed-up|^P[123] " "$OUT/$name.log" | tee -a "$LOG"; }
PF=""; [ -n "${PFLLIB:-}" ] && PF="--pfllib $PFLLIB --pfllib-rounds 2"
bench p1 200 --only P1 --engines batched batched+evalbs128 batched+evalbs8192 batched+eager sequential --rounds 3 \
  --timeout 100 --data-dir ../dataset/benchmark $PF
bench p2 110 --only P2 --engines sequential batched batched+eager batched+compiled --rounds 5 --timeout 80
bench p3 60 --only P3 --engines batched batched+eager --fill-state --rounds 3 --timeout 25
bench prec 60 --only P1 --engines batched+tf32 batched+bf16 --rounds 3 --timeout 28 --data-dir ../dataset/benchmark
cd ..
say "per-step cost at P2's shape"
SB_CLIENTS=50 SB_SHAPE=3,32,32 SB_RUNNERS="eager graph" timeout 70 $PY experiments/issue28_stepbench.py cuda 2>&1 \
  | grep -v Warning | tee -a "$LOG"
say "CUDA tests"
XD=""; $PY -c "import xdist" 2>/dev/null && XD="-n 8"
timeout 90 $PY -m pytest -q -p no:cacheprovider $XD tests/engines/test_capture.py tests/engines/test_devices.py \
  tests/engines/test_precision.py tests/system/test_auc.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$LOG"; tail -3 "$OUT/pytest.log" | tee -a "$LOG"
say done
