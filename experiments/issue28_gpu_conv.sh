#!/bin/bash
# Issue 28, P2's open lead on a GPU (about 3 minutes; a second call beside issue28_gpu.sh, which fills one
# 10-minute device call): P2 is bound by the batched step's vmapped (grouped) convolutions, 3.18 ms per
# captured step over 50 clients on an H200, and needs about 1.9 ms for 30x. Untried there: cuDNN's timed
# algorithm choice (--cudnn_benchmark) and channels-last (--conv_layout channels_last; auto is nchw on GPUs).
#   OUT=/tmp/gpu28conv bash experiments/issue28_gpu_conv.sh        (from the repository root)
set -u
OUT=${OUT:-/tmp/gpu28conv}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1; PY=${PY:-python3}
LOG="$OUT/run.log"; T0=$(date +%s)
say() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
$PY -c "import torch,sys; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$LOG"
say "P2: sequential and batched, cuDNN benchmark and layout variants, one process"
(cd system && timeout 150 $PY benchmark.py --device cuda --warmup 1 --only P2 --rounds 5 --timeout 60 \
  --engines sequential batched batched+cudnnbench batched+nhwc batched+cudnnbench+nhwc --out "$OUT/p2conv.json" \
  > "$OUT/p2conv.log" 2>&1; echo "rc=$?") | tee -a "$LOG"
grep -E "speed-up|^P2 " "$OUT/p2conv.log" | tee -a "$LOG"
for variant in "0 auto" "1 auto" "0 channels_last" "1 channels_last"; do
  set -- $variant; say "per-step cost at P2's shape: cudnn.benchmark=$1, layout $2"
  SB_CUDNN_BENCHMARK=$1 SB_LAYOUT=$2 SB_CLIENTS=50 SB_SHAPE=3,32,32 SB_RUNNERS="eager graph" timeout 45 \
    $PY experiments/issue28_stepbench.py cuda 2>&1 | grep -v Warning | tee -a "$LOG"
done
say done
