#!/usr/bin/env bash
# The GPU checks in one run (about 12 minutes on one H100/H200), from the repository root:
#   1. build the fused fixed-code CUDA kernel (megatron_ext/csrc);
#   2. check it against the PyTorch reference (tests/test_cuda_kernel.py: random ids, every
#      scheme and tiling, fp32/bf16/fp16, plus the nvcc compile check);
#   3. time it: bench/bench_embedding.py (learned table vs every scheme and tiling, 8,192
#      tokens, kernel bandwidth);
#   4. a few training steps of the 1.7B reference shape on one GPU, with Transformer Engine
#      layers and Megatron-LM's fused kernels when TE imports (else the local layers): bf16
#      (binary and learned), then FP8 (binary, TE only); tokens/s and MFU.
# Logs and summary.md go to $OUT/gpu_check when OUT is set, else /tmp/fixedcode_gpu_check.
# Each step has its own time limit; a failed step is recorded and the next one still runs.
#
#   bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PY=${PYTHON:-python}
RESULTS=${OUT:+$OUT/gpu_check}
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/fixedcode_gpu_check}
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.md
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # one arch: the fastest build
export PYTHONUNBUFFERED=1
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-720}

if "$PY" -c "import transformer_engine" 2>/dev/null; then HAVE_TE=1; else HAVE_TE=0; fi
IMPL=$( ((HAVE_TE)) && echo transformer_engine || echo local)
TRAIN=(pretrain_fixedcode.py --preset smollm2-1.7b --micro-batch-size 1 --global-batch-size 8
       --seq-length 2048 --train-iters 10 --bf16 --mock-data --tokenizer-type NullTokenizer
       --vocab-size 49152 --lr 3e-4 --log-interval 1 --eval-iters 0 --transformer-impl "$IMPL")

# step NAME LIMIT_S COMMAND...: run with a time limit, log to $RESULTS/NAME.log, record the
# outcome; skipped when the overall budget would be exceeded.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - (SECONDS - START)))
    if ((left < 30)); then
        echo "- $name: skipped (budget spent)" >>"$SUMMARY"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    local rc=$?
    tail -n 5 "$RESULTS/$name.log"
    echo "- $name: exit $rc after $((SECONDS - t0)) s ($name.log)" >>"$SUMMARY"
}

# The last logged tokens/s and MFU of a training log.
throughput() {
    local line
    line=$(grep -E "tokens/s" "$RESULTS/$1.log" | tail -n 1)
    echo "  - $1, last iteration: $(grep -oE "tokens/s: [0-9,]+" <<<"$line")" \
         "$(grep -oE "MFU: [0-9.]+%" <<<"$line")" >>"$SUMMARY"
}

{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
    "$PY" -c "import transformer_engine as te; print('Transformer Engine', te.__version__)" \
        2>/dev/null || echo "Transformer Engine: not importable"
    "$PY" -c "import megatron.core.tensor_parallel.layers as l; \
print('gradient accumulation fusion (apex):', l._grad_accum_fusion_available)"
    echo "training layers: --transformer-impl $IMPL"
    echo '```'
    echo
} >"$SUMMARY"

step build 300 "$PY" -m megatron_ext.cuda_extension
step parity 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_kernel.py
step bench_embedding 300 "$PY" bench/bench_embedding.py --tokens 8192 --reps 20
step train_binary_bf16 150 "$PY" "${TRAIN[@]}" --input-interface binary
step train_learned_bf16 150 "$PY" "${TRAIN[@]}" --input-interface learned
if ((HAVE_TE)); then
    step train_binary_fp8 150 "$PY" "${TRAIN[@]}" --input-interface binary --fp8-format hybrid
else
    echo "- train_binary_fp8: skipped (Transformer Engine not importable)" >>"$SUMMARY"
fi

{
    echo
    echo "## Throughput (1.7B shape, 8 x 2048 tokens per step, one GPU)"
    for run in train_binary_bf16 train_learned_bf16 train_binary_fp8; do
        [[ -f $RESULTS/$run.log ]] && throughput "$run"
    done
    echo
    echo "## Embedding benchmark"
    grep -E "^(#|\|)" "$RESULTS/bench_embedding.log" 2>/dev/null
    echo
    echo "total: $((SECONDS - START)) s"
} >>"$SUMMARY"
cat "$SUMMARY"
echo "logs: $RESULTS"
