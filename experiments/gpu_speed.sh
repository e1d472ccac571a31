#!/bin/bash
# The GPU speed tables (docs/results/performance.md) in one call (about 8 minutes on an H200), from the repository root:
#   PFLLIB=/path/to/PFLlib OUT=/tmp/gpu-speed bash experiments/gpu_speed.sh
# PART=unfold (about 7-8 minutes): P2 and P1 with --batched_conv grouped against unfold (im2col as one
# strided copy and batched matrix products) and grouped_nhwc (the grouped convolution channels-last; P2 also in bf16), all in
# flcore/engines/client_conv.py; per-step costs with a kernel profile; the CUDA tests. Why: cuDNN runs vmap's grouped
# convolution over the clients as one kernel per client (PART=conv's profile).
# PART=conv (about 5 minutes): cuDNN's timed algorithm choice (--cudnn_benchmark) and channels-last
# (--conv_layout) at P2, with a kernel profile per variant, the CUDA tests and a P1 check.
# PFLLIB: a PFLlib checkout (its system/main.py runs P1 beside ours; unset: our runs only).
# P1's MNIST folder is generated into dataset/benchmark first (benchmark.py --mnist-raw DIR, or kept
# from an earlier run). Logs and JSON per table in $OUT.
set -u
OUT=${OUT:-/tmp/gpu-speed}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1; PY=${PY:-python3}
LOG="$OUT/run.log"; T0=$(date +%s)
say() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
CUDA_TESTS="tests/engines/test_capture.py tests/engines/test_devices.py tests/engines/test_precision.py tests/system/test_auc.py"
cuda_tests() {  # timeout [more test files...]: the CUDA tests, from the repository root, 8 workers where xdist imports
  local t=$1; shift; say "CUDA tests"
  local xd=""; $PY -c "import xdist" 2>/dev/null && xd="-n 8"
  timeout "$t" $PY -m pytest -q -p no:cacheprovider $xd $CUDA_TESTS "$@" > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?" | tee -a "$LOG"; tail -3 "$OUT/pytest.log" | tee -a "$LOG"; }
$PY -c "import torch,sys; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$LOG"
cd system
if [ "${PART:-main}" = unfold ]; then  # about 7 minutes: --batched_conv grouped, unfold, grouped_nhwc (client_conv.py)
  say "P2: sequential, batched grouped, unfold, grouped_nhwc"
  # +bf16: cuDNN's grouped kernels for half types in NHWC may take all clients in one launch where fp32 NCHW loops
  timeout 230 $PY benchmark.py --device cuda --warmup 1 --only P2 --rounds 5 --timeout 50 --out "$OUT/p2unfold.json" \
    --engines sequential batched+grouped batched+unfold batched+groupednhwc batched+unfold+cudnnbench \
    batched+groupednhwc+cudnnbench batched+grouped+bf16 batched+groupednhwc+bf16 > "$OUT/p2unfold.log" 2>&1
  echo "rc=$?" | tee -a "$LOG"; grep -E "speed-up|^P2 " "$OUT/p2unfold.log" | tee -a "$LOG"
  say "P1: batched grouped, unfold and grouped_nhwc, ours only"
  timeout 90 $PY benchmark.py --device cuda --warmup 1 --only P1 --engines batched+grouped batched+unfold \
    batched+groupednhwc --rounds 3 --timeout 30 --data-dir ../dataset/benchmark --out "$OUT/p1unfold.json" \
    > "$OUT/p1unfold.log" 2>&1
  echo "rc=$?" | tee -a "$LOG"; grep -E "^P1 " "$OUT/p1unfold.log" | tee -a "$LOG"
  cd ..
  for variant in "grouped 50 3,32,32 0" "unfold 50 3,32,32 1" "grouped_nhwc 50 3,32,32 1" "grouped 20 1,28,28 0" \
      "unfold 20 1,28,28 0" "grouped_nhwc 20 1,28,28 0"; do
    set -- $variant; say "per-step cost: --batched_conv $1, $2 clients of $3"
    SB_BATCHED_CONV=$1 SB_CLIENTS=$2 SB_SHAPE=$3 SB_RUNNERS="eager graph" SB_PROFILE=$4 timeout 75 \
      $PY experiments/gpu_step_runners.py cuda 2>&1 | grep -v -E "Warning|USDT|host syncs|_warn_once" | tee -a "$LOG"
  done
  cuda_tests 100 tests/engines/test_client_conv.py
  say done; exit 0
fi
if [ "${PART:-main}" = conv ]; then
  say "P2: sequential and batched, cuDNN benchmark and layout variants, one process"
  timeout 150 $PY benchmark.py --device cuda --warmup 1 --only P2 --rounds 5 --timeout 60 --out "$OUT/p2conv.json" \
    --engines sequential batched batched+cudnnbench batched+nhwc batched+cudnnbench+nhwc > "$OUT/p2conv.log" 2>&1
  echo "rc=$?" | tee -a "$LOG"; grep -E "speed-up|^P2 " "$OUT/p2conv.log" | tee -a "$LOG"
  cd ..
  for variant in "0 auto" "1 auto" "0 channels_last" "1 channels_last"; do
    set -- $variant; say "per-step cost at P2's shape: cudnn.benchmark=$1, layout $2, with a kernel profile"
    SB_CUDNN_BENCHMARK=$1 SB_LAYOUT=$2 SB_CLIENTS=50 SB_SHAPE=3,32,32 SB_RUNNERS="eager graph" SB_PROFILE=1 timeout 60 \
      $PY experiments/gpu_step_runners.py cuda 2>&1 | grep -v -E "Warning|USDT" | tee -a "$LOG"
  done
  cuda_tests 100
  say "P1, ours only, batched (auto), as a check against the earlier 0.49 s"
  cd system; timeout 80 $PY benchmark.py --device cuda --warmup 1 --only P1 --engines batched --rounds 3 --timeout 60 \
    --data-dir ../dataset/benchmark --out "$OUT/p1check.json" > "$OUT/p1check.log" 2>&1
  echo "rc=$?" | tee -a "$LOG"; grep -E "^P1 " "$OUT/p1check.log" | tee -a "$LOG"; cd ..
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
SB_CLIENTS=50 SB_SHAPE=3,32,32 SB_RUNNERS="eager graph" timeout 70 $PY experiments/gpu_step_runners.py cuda 2>&1 \
  | grep -v Warning | tee -a "$LOG"
cuda_tests 90
say done
