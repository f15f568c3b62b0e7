#!/usr/bin/env bash
# The first GPU run in one script: one H100/H200, within 15 minutes, from the repository root:
#   bash bench/gpu_check.sh
# Each step answers one question, in the order they matter, and prints one verdict line
# (PASS / FAIL / SKIP); the script ends with summary.md, tables ready to paste into
# bench/RESULTS.md.
#   1. kernel: the fused fixed-code CUDA kernel builds and equals the PyTorch reference bit
#      for bit (tests/test_cuda_kernel.py: both schemes, fp32/bf16/fp16);
#   2. kernel_in_training: a training run with --fixed-code-impl cuda forced (auto would fall
#      back to PyTorch silently);
#   3. recipe_flags, resume, convert: the recipe's GPU-only flags at DP=1 (Transformer Engine
#      layers, --use-distributed-optimizer --overlap-grad-reduce --fp8-format hybrid; without
#      TE: local layers and no FP8), saving;
#      resuming that checkpoint; tools/convert_to_hf.py --validate of it;
#   4. fp16: 20 iterations under the dynamic loss scaler (its overflow skips counted apart);
#   5. bf16_vs_fp8: the 1.7B shape with TE layers, bf16 then FP8, same seed and data: are the
#      losses alike (mean of the last 5 iterations within 3%)?
#   6. throughput: tokens/s and MFU of the 1.7B shape (the runs of step 5, and the learned arm
#      in bf16; local layers without TE);
#   7. input_layer: the input layer alone (bench/bench_embedding.py).
# GPU_CHECK_STEPS="recipe_flags input_layer" runs only those steps (names as above).
# Steps 2-4 use a small model (4 layers, hidden 1024): their flags matter, not the shape.
# Logs, metrics files and summary.md go to $OUT/gpu_check when OUT is set, else
# /tmp/fixedcode_gpu_check (emptied first). A failed step is recorded and the next one runs;
# a step is skipped when what it needs failed or the budget (GPU_CHECK_BUDGET_S, default
# 870 s) is spent. First run on an H200 without TE: bench/RESULTS.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PY=${PYTHON:-python}
RESULTS=${OUT:+$OUT/gpu_check}
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/fixedcode_gpu_check}
rm -rf "$RESULTS"  # a rerun must not resume the previous run's checkpoints
mkdir -p "$RESULTS"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # one arch: the fastest build
export CUDA_DEVICE_MAX_CONNECTIONS=1  # as train.sh and the sbatch template
export PYTHONUNBUFFERED=1
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-870}
# GPU_CHECK_STEPS: the steps to run (default all), e.g. to rerun the ones that failed.
STEPS=${GPU_CHECK_STEPS:-kernel kernel_in_training recipe_flags fp16 bf16_vs_fp8 throughput input_layer}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

if "$PY" -c "import transformer_engine" 2>/dev/null; then HAVE_TE=1; else HAVE_TE=0; fi
COMMON=(--mock-data --tokenizer-type NullTokenizer --vocab-size 49151 --lr 3e-4
        --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --num-workers 2 --bf16)
SMALL=(pretrain_fixedcode.py "${COMMON[@]}" --num-layers 4 --hidden-size 1024
       --ffn-hidden-size 4096 --num-attention-heads 16 --seq-length 1024
       --micro-batch-size 2 --global-batch-size 8)
# Without Transformer Engine the GPU-only flags still run, on the local layers and without FP8
# (the verdicts say so); FP8 needs TE.
if ((HAVE_TE)); then
    LAYERS=transformer_engine
    FP8=(--fp8-format hybrid)
else
    LAYERS=local
    FP8=()
fi
BIG=(pretrain_fixedcode.py "${COMMON[@]}" --preset smollm2-1.7b --seq-length 2048
     --micro-batch-size 1 --global-batch-size 8 --train-iters 20 --transformer-impl "$LAYERS")
RECIPE_GPU_FLAGS=(--transformer-impl "$LAYERS" --use-distributed-optimizer --overlap-grad-reduce
                  "${FP8[@]}")
CKPT=$RESULTS/checkpoints

# run NAME LIMIT_S COMMAND...: run with a time limit (cut to what is left of the budget),
# output in $RESULTS/NAME.log; the command's status (124: timed out, 125: budget spent).
run() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - (SECONDS - START)))
    if ((left < 30)); then
        echo "budget spent before this step" >"$RESULTS/$name.log"
        return 125
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit}s): $*"
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
}

# detail NAME [PATTERN]: the last line of NAME.log (matching PATTERN), fit for a table cell.
detail() {
    local line
    line=$(grep -E "${2:-.}" "$RESULTS/$1.log" 2>/dev/null | tail -n 1)
    tr '|' '/' <<<"${line:-no output}" | cut -c1-160
}

# mark: a step starts (its clock, no result line yet). verdict STEP PASS|FAIL|SKIP DETAIL:
# the step's line on stdout and its row in the summary, with the seconds since mark.
mark() {
    T0=$SECONDS
    line=""
}
verdict() {
    printf '[gpu_check] %-4s %-18s %s (%s s)\n' "$2" "$1" "$3" "$((SECONDS - T0))"
    printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$((SECONDS - T0))" >>"$RESULTS/steps.md"
}

# stats KIND FILE...: one line from metrics files; exit status 1 when it is a failure.
#   final F: last iteration and loss; fp16 F: overflow skips, loss scale, final loss;
#   compare BF16 FP8: mean losses of the last 5 iterations; speed F: mean tokens/s and MFU
#   after the first 5 iterations.
stats() {
    "$PY" - "$@" <<'PYEOF'
import math, statistics, sys
from megatron_ext.metric_sinks import read_metrics
kind, files = sys.argv[1], sys.argv[2:]
runs = [{r["iteration"]: r for r in read_metrics(f) if r["kind"] == "train"} for f in files]
last = runs[0][max(runs[0])]
loss = last.get("lm loss", math.nan)
if kind == "final":
    print(f"iteration {last['iteration']}, loss {loss:.4f}")
    sys.exit(not math.isfinite(loss))
if kind == "fp16":
    print(f"iteration {last['iteration']}, {last['overflow-skipped-iterations']} overflow "
          f"skips, loss scale {last['loss-scale']:g}, {last['skipped-iterations']} non-finite, "
          f"loss {loss:.4f}")
    sys.exit(not math.isfinite(loss) or last["skipped-iterations"] > 0)
if kind == "compare":
    bf16, fp8 = (statistics.mean(r[i]["lm loss"] for i in sorted(r)[-5:]) for r in runs)
    diff = abs(fp8 - bf16) / bf16
    print(f"mean loss of the last 5 iterations: bf16 {bf16:.4f}, FP8 {fp8:.4f} "
          f"({100 * diff:.2f}% apart)")
    sys.exit(not diff < 0.03)
if kind == "speed":
    steady = [r for i, r in sorted(runs[0].items()) if i > 5]
    mfu = [r["mfu"] for r in steady if "mfu" in r]
    print(f"| {statistics.mean(r['tokens-per-second'] for r in steady):,.0f} | "
          + (f"{100 * statistics.mean(mfu):.1f}% |" if mfu else "n/a |"))
PYEOF
}

{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
    "$PY" -c "import transformer_engine as te; print('Transformer Engine', te.__version__)" \
        2>/dev/null || echo "Transformer Engine: not importable"
    "$PY" -W ignore -c "import megatron.core.tensor_parallel.layers as l; \
print('gradient accumulation fusion (apex):', l._grad_accum_fusion_available)"
    echo '```'
} >"$RESULTS/machine.md"
cat "$RESULTS/machine.md"

# 1. The kernel builds and equals the reference (every GPU case passes, none skipped).
if wanted kernel; then
    mark
    if run build 300 "$PY" -m megatron_ext.cuda_extension \
            && run parity 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_kernel.py \
                -k equals_reference_on_gpu \
            && line=$(tail -n 1 "$RESULTS/parity.log") && [[ $line == *" passed"* ]] \
            && ! grep -qE "failed|skipped|error" <<<"$line"; then
        verdict kernel PASS "$(detail parity passed)"
        KERNEL=1
    else
        verdict kernel FAIL "$(detail parity) / build: $(detail build)"
        KERNEL=0
    fi
else
    KERNEL=1  # not checked here: the steps below build it on first use
fi

# 2. The kernel inside training (gf2: A and b on the device), forced.
if wanted kernel_in_training; then
    mark
    if ((!KERNEL)); then
        verdict kernel_in_training SKIP "the kernel failed"
    elif run kernel_in_training 150 "$PY" "${SMALL[@]}" --input-interface gf2 --train-iters 10 \
            --fixed-code-impl cuda --metrics-file "$RESULTS/kernel_in_training.jsonl" \
            && line=$(stats final "$RESULTS/kernel_in_training.jsonl"); then
        verdict kernel_in_training PASS "$line"
    else
        verdict kernel_in_training FAIL "$(detail kernel_in_training)"
    fi
fi

# 3. The recipe's GPU-only flags at DP=1: train 3 of 6 iterations and save, resume to 6,
#    convert the checkpoint and validate the conversion.
if wanted recipe_flags; then
    mark
    RECIPE_RUN=("$PY" "${SMALL[@]}" "${RECIPE_GPU_FLAGS[@]}" --input-interface binary
                --train-iters 6 --save "$CKPT" --load "$CKPT" --save-interval 3
                --metrics-file "$RESULTS/recipe_flags.jsonl")
    if run recipe_flags 150 "${RECIPE_RUN[@]}" --exit-interval 3 \
            && grep -q "saved checkpoint $CKPT/iter_0000003" "$RESULTS/recipe_flags.log"; then
        verdict recipe_flags PASS "$LAYERS layers: $(detail recipe_flags "saved checkpoint")"
        mark
        if run resume 150 "${RECIPE_RUN[@]}" \
                && grep -q "resumed from $CKPT/iter_0000003 at iteration 3" "$RESULTS/resume.log" \
                && line=$(stats final "$RESULTS/recipe_flags.jsonl"); then
            verdict resume PASS "from iteration 3: $line"
        else
            verdict resume FAIL "$(detail resume)"
        fi
        mark
        if run convert 150 "$PY" tools/convert_to_hf.py --load "$CKPT" \
                --output "$RESULTS/hf" --validate; then
            verdict convert PASS "$(detail convert "validate: max")"
        else
            verdict convert FAIL "$(detail convert)"
        fi
    else
        verdict recipe_flags FAIL "$(detail recipe_flags)"
        verdict resume SKIP "no checkpoint"
        verdict convert SKIP "no checkpoint"
    fi
fi

# 4. fp16: the loss scaler comes down from 2^32 with skipped steps, and training goes on.
if wanted fp16; then
    mark
    if run fp16 150 "$PY" "${SMALL[@]/--bf16/--fp16}" --input-interface binary --train-iters 20 \
            --metrics-file "$RESULTS/fp16.jsonl" && line=$(stats fp16 "$RESULTS/fp16.jsonl"); then
        verdict fp16 PASS "$line"
    else
        verdict fp16 FAIL "${line:-$(detail fp16)}"
    fi
fi

# 5. bf16 vs FP8 at the 1.7B shape (TE layers), same seed and data. The bf16 run is also a
#    throughput figure of step 6, so it runs without TE too (local layers).
if wanted bf16_vs_fp8; then
    mark
    run big_binary_bf16 180 "$PY" "${BIG[@]}" --input-interface binary \
        --metrics-file "$RESULTS/big_binary_bf16.jsonl"
    BF16=$?
    if ((!HAVE_TE)); then
        verdict bf16_vs_fp8 SKIP "Transformer Engine not importable"
    elif ((BF16 == 0)) && run big_binary_fp8 180 "$PY" "${BIG[@]}" --input-interface binary \
            --fp8-format hybrid --metrics-file "$RESULTS/big_binary_fp8.jsonl"; then
        if line=$(stats compare "$RESULTS/big_binary_bf16.jsonl" "$RESULTS/big_binary_fp8.jsonl")
        then
            verdict bf16_vs_fp8 PASS "$line"
        else
            verdict bf16_vs_fp8 FAIL "$line"
        fi
    else
        verdict bf16_vs_fp8 FAIL "$(detail big_binary_bf16) / $(detail big_binary_fp8)"
    fi
fi

# 6. Throughput: the learned arm in bf16 beside the binary runs of step 5.
if wanted throughput; then
    mark
    if [[ ! -s $RESULTS/big_binary_bf16.jsonl ]]; then
        run big_binary_bf16 180 "$PY" "${BIG[@]}" --input-interface binary \
            --metrics-file "$RESULTS/big_binary_bf16.jsonl"
    fi
    run big_learned_bf16 180 "$PY" "${BIG[@]}" --input-interface learned \
        --metrics-file "$RESULTS/big_learned_bf16.jsonl"
    {
        echo "| run | input | precision | tokens/s | MFU |"
        echo "|---|---|---|---:|---:|"
        for run in big_binary_bf16 big_learned_bf16 big_binary_fp8; do
            if [[ -s $RESULTS/$run.jsonl ]]; then
                read -r _ input precision <<<"${run//_/ }"
                echo "| $run | $input | $precision $(stats speed "$RESULTS/$run.jsonl")"
            fi
        done
    } >"$RESULTS/throughput.md"
    runs=$(grep -c "^| big_" "$RESULTS/throughput.md")
    verdict throughput "$( ((runs)) && echo PASS || echo FAIL)" \
        "$runs runs measured ($LAYERS layers); $(detail big_binary_bf16 "MFU against")"
fi

# 7. The input layer alone, every scheme and tiling, PyTorch path and kernel (rows are printed
#    as they are measured: a step cut by its limit keeps the rows it has).
if wanted input_layer; then
    mark
    run input_layer 240 "$PY" bench/bench_embedding.py --tokens 8192 --reps 20
    status=$?
    rows=$(grep -c "^| 8192 " "$RESULTS/input_layer.log")
    verdict input_layer "$( ((status == 0)) && echo PASS || echo FAIL)" "$rows rows measured"
fi

{
    echo "## GPU check (bench/gpu_check.sh, $((SECONDS - START)) s)"
    echo
    cat "$RESULTS/machine.md"
    echo
    echo "| step | verdict | detail | s |"
    echo "|---|---|---|---:|"
    cat "$RESULTS/steps.md" 2>/dev/null
    echo
    echo "### Throughput: 1.7B shape, 8 x 2048 tokens per step, one GPU, $LAYERS layers"
    echo
    echo "MFU peaks: $(detail big_binary_bf16 "MFU against"); $(detail big_binary_fp8 "MFU against")"
    echo
    cat "$RESULTS/throughput.md" 2>/dev/null
    echo
    echo "### Input layer (bench/bench_embedding.py)"
    echo
    grep -E "^(#|\|)" "$RESULTS/input_layer.log" 2>/dev/null
} >"$RESULTS/summary.md"
cat "$RESULTS/summary.md"
echo "logs: $RESULTS"
