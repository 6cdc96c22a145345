#!/bin/bash
# The torch backend on a CUDA GPU, in one go (docs/testing.md#gpu): tests/test_gpu.py (GPU against CPU), the training-step
# benchmark (torch on the GPU against torch on this machine's CPU, demo and full size) and the demo recipe trained
# and evaluated on the GPU. Logs and the demo's results.json / curves.png go to $OUT (default /tmp/gpu-check).
#   tools/gpu_check.sh            # python3 with torch (CUDA), numpy, opencv, scipy, scikit-learn, matplotlib, yacs
# Each part has its own time limit and a failing part does not stop the others; the exit status is the tests'.
set -u
OUT=${OUT:-/tmp/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REID_BACKEND=torch REID_ALLOW_MISSING_BACKEND=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nproc
    $PY -c "import sys, numpy, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.version.cuda, 'numpy', numpy.__version__, 'gpu', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"

SECONDS=0
timeout "${TEST_LIMIT:-240}" $PY -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/test_gpu.log"
status=${PIPESTATUS[0]}
echo "tests/test_gpu.py: exit $status after $SECONDS s" | tee -a "$OUT/test_gpu.log"

SECONDS=0
timeout "${BENCH_LIMIT:-200}" $PY bench/train_step.py --gpu --variants torch,torch-gpu --sizes "${BENCH_SIZES:-demo,full}" \
    --repeats 3 --max-rss-gb 0 2>&1 | tee "$OUT/bench_train_step.log"
echo "bench/train_step.py: exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$OUT/bench_train_step.log"

SECONDS=0
demo=$(mktemp -d)
timeout "${DEMO_LIMIT:-200}" $PY train.py --config-file configs/synthetic/acl.yml --device gpu --max-restarts 0 \
    DATASETS.ROOT "$demo/data" OUTPUT_DIR "$demo/out" > "$OUT/demo.log" 2>&1
echo "demo on the GPU: exit $? after $SECONDS s" | tee -a "$OUT/demo.log"
tail -n 25 "$OUT/demo.log"
cp "$demo/out/results.json" "$demo/out/curves.png" "$OUT/" 2>/dev/null
exit "$status"
