#!/bin/bash
# The default MindSpore 2.7 stack on a CUDA GPU against torch on the same GPU (docs/testing.md#gpu). Untested: no
# GPU machine was available when it was written.
#
# MindSpore 2.7's CPU wheel from PyPI carries its GPU plugins (mindspore/lib/plugin/gpu11.1, gpu11.6), which link
# against CUDA 11 libraries it does not bring: libcudart.so.11.0, libcublas.so.11, libcufft.so.10,
# libcurand.so.10, libcusolver.so.11, libcusparse.so.11, libnvrtc.so.11.2 and cuDNN 8 (libcudnn.so.8), plus the
# driver's libcuda.so.1 (`ldd mindspore/lib/plugin/libmindspore_gpu.so.11.6`). This script installs them from
# PyPI's nvidia-*-cu11 wheels into a folder of their own (not into .venv), puts their lib/ folders on
# LD_LIBRARY_PATH, then, each part with its own time limit and logging to $OUT (default /tmp/gpu-ms27):
#   1. MindSpore's own check on the GPU (mindspore.set_device("GPU"); mindspore.run_check());
#   2. the parity tests (-m parity) with this process's MindSpore on the GPU (REID_TEST_DEVICE=gpu,
#      tests/conftest.py) against the torch environment's CPU numbers;
#   3. the demo recipe trained and evaluated with --device gpu on the 2.7 stack, then with --backend torch
#      --device gpu on the same GPU (torch: $TORCH_PY, a CUDA build; .venv-torch is the CPU build);
#   4. bench/train_step.py's torch GPU rows (tools/gpu_check.sh runs torch's own GPU tests).
#   tools/gpu_ms27.sh        # needs the driver (nvidia-smi), network to PyPI, python3.11 (make setup-ms27)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-ms27}
CUDA_DIR=${CUDA_DIR:-$PWD/.cuda11}
MS_PY=${MS_PY:-.venv/bin/python}
TORCH_PY=${TORCH_PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 REID_ALLOW_MISSING_BACKEND=1

[ -x "$MS_PY" ] || make setup-ms27 setup-torch || exit 1
# CUDA 11.8's runtime libraries (the sonames above; CUDA 11 keeps one soname per library across 11.x) and the
# last cuDNN 8 built for CUDA 11
if [ ! -f "$CUDA_DIR/.stamp" ]; then
    "$MS_PY" -m pip install -q --disable-pip-version-check --no-deps --target "$CUDA_DIR" \
        nvidia-cuda-runtime-cu11==11.8.89 nvidia-cublas-cu11==11.11.3.6 nvidia-cufft-cu11==10.9.0.58 \
        nvidia-curand-cu11==10.3.0.86 nvidia-cusolver-cu11==11.4.1.48 nvidia-cusparse-cu11==11.7.5.86 \
        nvidia-cuda-nvrtc-cu11==11.8.89 nvidia-cudnn-cu11==8.9.6.50 || exit 1
    touch "$CUDA_DIR/.stamp"
fi
LIBS=$(ls -d "$CUDA_DIR"/nvidia/*/lib | paste -sd:)
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nproc
    plugin=$("$MS_PY" -c "import mindspore, os; print(os.path.dirname(mindspore.__file__))")/lib/plugin
    echo "libraries the GPU plugin does not find:"
    ldd "$plugin"/libmindspore_gpu.so.11.6 | grep "not found" || echo "  none"
    $TORCH_PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"

SECONDS=0
timeout "${CHECK_LIMIT:-300}" "$MS_PY" -c "import mindspore; mindspore.set_device('GPU'); mindspore.run_check()" \
    2>&1 | tee "$OUT/run_check.log"
echo "mindspore.run_check on the GPU: exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$OUT/run_check.log"

SECONDS=0
REID_TEST_DEVICE=gpu REID_BACKEND=mindspore timeout "${TEST_LIMIT:-1800}" "$MS_PY" -m pytest tests -m parity -q -rs \
    -p no:cacheprovider --durations=10 2>&1 | tee "$OUT/parity_gpu.log"
status=${PIPESTATUS[0]}
echo "parity tests, MindSpore 2.7 on the GPU: exit $status after $SECONDS s" | tee -a "$OUT/parity_gpu.log"

for backend in mindspore torch; do
    SECONDS=0
    demo=$(mktemp -d)
    py=$MS_PY; [ $backend = torch ] && py=$TORCH_PY
    REID_BACKEND=$backend timeout "${DEMO_LIMIT:-900}" $py train.py --config-file configs/synthetic/acl.yml --device gpu \
        --max-restarts 0 DATASETS.ROOT "$demo/data" OUTPUT_DIR "$demo/out" > "$OUT/demo_$backend.log" 2>&1
    echo "demo, $backend on the GPU: exit $? after $SECONDS s" | tee -a "$OUT/demo_$backend.log"
    tail -n 12 "$OUT/demo_$backend.log"
    cp "$demo/out/results.json" "$OUT/results_$backend.json" 2>/dev/null
done

SECONDS=0
REID_BACKEND=torch timeout "${BENCH_LIMIT:-300}" $TORCH_PY bench/train_step.py --gpu --variants torch,torch-gpu \
    --sizes demo --repeats 3 --max-rss-gb 0 2>&1 | tee "$OUT/bench_torch_gpu.log"
echo "bench/train_step.py (torch): exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$OUT/bench_torch_gpu.log"
exit "$status"
