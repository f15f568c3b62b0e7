#!/usr/bin/env bash
# The GPU check in one script, sized for a short slot (one H100/H200; 10 minutes per command,
# about 15 in all with the machine's start), from the repository root:
#   bash bench/gpu_check.sh
# Steps run in this order, never-run things first, already-passed ones last:
#   te_bf16_fp8      Transformer Engine layers (when TE imports) at the 1.7B shape, bf16 then
#                    FP8 (hybrid, delayed), same seed and data: throughput of each, FP8's loss
#                    within 1% of bf16's at every iteration, TE's chosen attention backend;
#   local_attention  the GPU-only SDPA tests (pinned kernels, bf16 parity with the unfused
#                    path), then local layers at the 1.7B shape, SDPA (--attention-backend
#                    auto) on the binary and the learned arm: throughput, the fixed/learned ratio, a 2-step
#                    profile of the binary run by kernel category; then (verdict local_unfused)
#                    the unfused attention on the binary arm beside them;
#   recipe_flags     the recipe's GPU-only flags at DP=1 (TE layers when TE imports,
#                    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather,
#                    FP8 with TE), saving; then resume and convert (tools/convert_to_hf.py
#                    --validate);
#   kernel, kernel_in_training, fp16, input_layer   passed on the first GPU run (H200,
#                    bench/RESULTS.md): the fused fixed-code kernel's parity and its use in
#                    training, 20 fp16 iterations under the loss scaler, the input layer alone.
# GPU_CHECK_STEPS="local_attention recipe_flags" runs only those (names as above);
# GPU_CHECK_SKIP_PASSED=1 drops the last four. Throughput: micro-batch GPU_CHECK_MICRO_BATCH
# (default 4, the recipe's range is 4-8) of 2048 tokens, no accumulation, 14 iterations: the
# first 4 dropped, iterations 5-12 counted (total tokens over their total time; 13-14 are
# the profiled ones), per GPU, with model TFLOP/s, MFU (dense bf16 peak; FP8 runs also
# against the FP8 peak) and peak allocated/reserved memory.
# Verdicts: a step passes when its commands exit 0 and no log holds a Traceback. Each verdict
# and table row is appended to summary.md as soon as it is known, so a killed run keeps what
# ran. Budget: GPU_CHECK_BUDGET_S (default 540 s); a step that would start with less than 30 s
# left is recorded as skipped. Logs, metrics and summary.md go to $OUT/gpu_check when OUT is
# set, else /tmp/fixedcode_gpu_check (emptied first). GPU_CHECK_DRY_RUN=1 prints the plan
# (every command, in order) without running anything: it works on a CPU machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PY=${PYTHON:-python}
RESULTS=${OUT:+$OUT/gpu_check}
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/fixedcode_gpu_check}
rm -rf "$RESULTS"  # a rerun must not resume the previous run's checkpoints
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.md
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # one arch: the fastest build
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONUNBUFFERED=1
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-540}
DRY=${GPU_CHECK_DRY_RUN:-0}
NEW_STEPS="te_bf16_fp8 local_attention recipe_flags"
PASSED_STEPS="kernel kernel_in_training fp16 input_layer"
if [[ ${GPU_CHECK_SKIP_PASSED:-0} == 1 ]]; then PASSED_STEPS=""; fi
STEPS=${GPU_CHECK_STEPS:-$NEW_STEPS $PASSED_STEPS}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

if [[ -n ${GPU_CHECK_HAVE_TE:-} ]]; then
    HAVE_TE=$GPU_CHECK_HAVE_TE  # for a dry run's plan
elif "$PY" -c "import transformer_engine" 2>/dev/null; then HAVE_TE=1; else HAVE_TE=0; fi
MICRO=${GPU_CHECK_MICRO_BATCH:-4}
SKIP=4 UNTIL=12 ITERS=14
COMMON=(--mock-data --tokenizer-type NullTokenizer --vocab-size 49151 --lr 3e-4
        --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --num-workers 2 --bf16)
SMALL=(pretrain_fixedcode.py "${COMMON[@]}" --num-layers 4 --hidden-size 1024
       --ffn-hidden-size 4096 --num-attention-heads 16 --seq-length 1024
       --micro-batch-size 2 --global-batch-size 8)
BIG=(pretrain_fixedcode.py "${COMMON[@]}" --preset smollm2-1.7b --seq-length 2048
     --micro-batch-size "$MICRO" --global-batch-size "$MICRO" --train-iters "$ITERS")
if ((HAVE_TE)); then
    RECIPE_GPU_FLAGS=(--transformer-impl transformer_engine --fp8-format hybrid)
else
    RECIPE_GPU_FLAGS=(--transformer-impl local)
fi
RECIPE_GPU_FLAGS+=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
CKPT=$RESULTS/checkpoints

# run NAME LIMIT_S COMMAND...: run with a time limit (cut to what is left of the budget),
# output in $RESULTS/NAME.log. Status: the command's, 124 timed out, 125 budget spent, and 1
# when the log holds a Traceback whatever the status.
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
    if ((DRY)); then
        return 0
    fi
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    local status=$?
    if ((status == 0)) && grep -q "Traceback" "$RESULTS/$name.log"; then
        return 1
    fi
    return $status
}

# detail NAME [PATTERN]: a line of NAME.log fit for a table cell: the last one matching
# PATTERN, else the last error line (an exception, "error:"), else the last line.
detail() {
    local line
    line=$(grep -E "${2:-^$}" "$RESULTS/$1.log" 2>/dev/null | tail -n 1)
    [[ -z $line ]] && line=$(grep -E "Error|error:|Killed" "$RESULTS/$1.log" 2>/dev/null \
                             | grep -v "Warning" | tail -n 1)
    [[ -z $line ]] && line=$(tail -n 1 "$RESULTS/$1.log" 2>/dev/null)
    tr '|' '/' <<<"${line:-no output}" | cut -c1-200
}

# report ARGS...: bench/gpu_check_report.py's line (its status); "(dry run)" in a dry run.
report() {
    if ((DRY)); then
        echo "(dry run)"
        return 0
    fi
    "$PY" bench/gpu_check_report.py "$@" 2>&1 | tail -n 1
    return "${PIPESTATUS[0]}"
}

# summary.md = the machine, the steps' verdicts, then the tables; rewritten (atomically)
# whenever a verdict or a row is added.
refresh() {
    cat "$RESULTS/head.md" "$RESULTS/steps.md" "$RESULTS/sections.md" >"$SUMMARY.tmp" 2>/dev/null
    mv "$SUMMARY.tmp" "$SUMMARY"
}
# add TEXT...: lines for the tables part of summary.md.
add() { printf '%s\n' "$@" >>"$RESULTS/sections.md"; refresh; }
# mark: a step starts (its clock). verdict STEP PASS|FAIL|SKIP DETAIL: the step's line on
# stdout and its row in summary.md, at once (DRY in a dry run).
mark() { T0=$SECONDS; }
verdict() {
    local v=$2
    ((DRY)) && [[ $v == PASS ]] && v=DRY
    printf '[gpu_check] %-4s %-18s %s (%s s)\n' "$v" "$1" "$3" "$((SECONDS - T0))"
    printf '| %s | %s | %s | %s |\n' "$1" "$v" "$3" "$((SECONDS - T0))" >>"$RESULTS/steps.md"
    refresh
}
# table TITLE [HEADER]: open a table (its rows are added as they are measured).
table() { add "" "### $1" "" ${2:+"$2"}; }
SPEED_HEADER="| run | tokens/s per GPU | TFLOP/s per GPU | MFU (bf16 peak) | MFU (FP8 peak) | peak allocated GiB | peak reserved GiB | iterations |
|---|---:|---:|---:|---:|---:|---:|---:|"
# speed NAME: the throughput row of run NAME, appended to summary.md.
speed() { add "$(report speed "$1" "$RESULTS/$1.jsonl" --skip $SKIP --until $UNTIL)"; }

{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    echo '```'
    if ((DRY)); then
        echo "dry run: nothing executed"
    else
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
        "$PY" -c "import transformer_engine as te; print('Transformer Engine', te.__version__)" \
            2>/dev/null || echo "Transformer Engine: not importable"
        "$PY" -W ignore -c "import megatron.core.tensor_parallel.layers as l; \
print('gradient accumulation fusion (apex):', l._grad_accum_fusion_available)"
    fi
    echo '```'
    echo
    echo "Budget ${BUDGET} s; steps: $STEPS"
    echo
} >"$RESULTS/head.md"
printf '| step | verdict | detail | s |\n|---|---|---|---:|\n' >"$RESULTS/steps.md"
: >"$RESULTS/sections.md"
refresh
cat "$SUMMARY"

# 1. Transformer Engine layers: bf16, then FP8, at the 1.7B shape.
if wanted te_bf16_fp8; then
    mark
    if ((!HAVE_TE)); then
        verdict te_bf16_fp8 SKIP "Transformer Engine not importable"
    else
        table "Transformer Engine layers, 1.7B shape, $MICRO x 2048 tokens per step" \
            "$SPEED_HEADER"
        # NVTE_DEBUG: TE logs the attention backend it selects.
        TE_RUN=(env NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=1 "$PY" "${BIG[@]}"
                --transformer-impl transformer_engine --input-interface binary)
        run te_binary_bf16 170 "${TE_RUN[@]}" --metrics-file "$RESULTS/te_binary_bf16.jsonl"
        BF16=$?
        ((BF16 == 0)) && speed te_binary_bf16
        run te_binary_fp8 170 "${TE_RUN[@]}" --fp8-format hybrid \
            --metrics-file "$RESULTS/te_binary_fp8.jsonl"
        FP8=$?
        ((FP8 == 0)) && speed te_binary_fp8
        backend=$(detail te_binary_bf16 "[Ss]elected backend|backend = ")
        if ((BF16 == 0 && FP8 == 0)) && line=$(report compare "$RESULTS/te_binary_bf16.jsonl" \
                "$RESULTS/te_binary_fp8.jsonl"); then
            verdict te_bf16_fp8 PASS "$line; attention: $backend"
        else
            verdict te_bf16_fp8 FAIL "${line:-bf16: $(detail te_binary_bf16) / FP8: $(detail te_binary_fp8)}"
        fi
    fi
fi

# 2. Local layers: SDPA on the fixed and the learned input, then the unfused attention (its
#    own verdict: the s x s scores of 4 sequences may not fit where SDPA's do).
if wanted local_attention; then
    mark
    table "Local layers, 1.7B shape, $MICRO x 2048 tokens per step" "$SPEED_HEADER"
    LOCAL_RUN=("$PY" "${BIG[@]}" --transformer-impl local)
    ok=1
    # The pinned SDPA kernels run and equal the unfused attention in bf16 (GPU-only tests).
    run sdpa_parity 90 "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_attention.py -k gpu \
        && { ((DRY)) || ! grep -qE "[0-9]+ (failed|skipped|error)" "$RESULTS/sdpa_parity.log"; } \
        || ok=0
    run local_sdpa_binary 170 "${LOCAL_RUN[@]}" --input-interface binary \
        --metrics-file "$RESULTS/local_sdpa_binary.jsonl" --profile --use-pytorch-profiler \
        --profile-step-start $UNTIL --profile-step-end $ITERS \
        --tensorboard-dir "$RESULTS/profile" && speed local_sdpa_binary || ok=0
    run local_sdpa_learned 150 "${LOCAL_RUN[@]}" --input-interface learned \
        --metrics-file "$RESULTS/local_sdpa_learned.jsonl" && speed local_sdpa_learned || ok=0
    if ((ok)) && ratio=$(report ratio "$RESULTS/local_sdpa_learned.jsonl" \
            "$RESULTS/local_sdpa_binary.jsonl" --skip $SKIP --until $UNTIL); then
        add "" "SDPA runs: $ratio"
        verdict local_attention PASS "$ratio"
    else
        verdict local_attention FAIL "parity: $(detail sdpa_parity "passed|failed") / binary: $(detail local_sdpa_binary) / learned: $(detail local_sdpa_learned)"
    fi
    mark
    if run local_unfused_binary 150 "${LOCAL_RUN[@]}" --input-interface binary \
            --attention-backend unfused --metrics-file "$RESULTS/local_unfused_binary.jsonl"
    then
        speed local_unfused_binary
        verdict local_unfused PASS "row in the table"
    else
        verdict local_unfused FAIL "$(detail local_unfused_binary)"
    fi
    table "Profile of local_sdpa_binary, iterations $((UNTIL + 1))-$ITERS, GPU kernels"
    if ((DRY)); then add "(dry run)"; else add "$("$PY" bench/gpu_check_report.py profile \
        "$RESULTS/profile" 2>&1 | tail -n 12)"; fi
fi

# 3. The recipe's GPU-only flags at DP=1: train 3 of 6 iterations and save, resume to 6,
#    convert the checkpoint and validate the conversion.
if wanted recipe_flags; then
    mark
    RECIPE_RUN=("$PY" "${SMALL[@]}" "${RECIPE_GPU_FLAGS[@]}" --input-interface binary
                --train-iters 6 --save "$CKPT" --load "$CKPT" --save-interval 3
                --metrics-file "$RESULTS/recipe_flags.jsonl")
    if run recipe_flags 120 "${RECIPE_RUN[@]}" --exit-interval 3; then
        verdict recipe_flags PASS "${RECIPE_GPU_FLAGS[*]}: $(detail recipe_flags "saved checkpoint")"
        mark
        if run resume 120 "${RECIPE_RUN[@]}" && line=$(report final "$RESULTS/recipe_flags.jsonl")
        then
            verdict resume PASS "from iteration 3: $line"
        else
            verdict resume FAIL "$(detail resume)"
        fi
        mark
        if run convert 120 "$PY" tools/convert_to_hf.py --load "$CKPT" \
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

# 4. Passed on the first GPU run: the kernel, its use in training, fp16, the input layer.
if wanted kernel; then
    mark
    if run build 240 "$PY" -m megatron_ext.codes.cuda_extension \
            && run parity 120 "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_cuda_kernel.py \
                -k equals_reference_on_gpu \
            && { ((DRY)) || ! grep -qE "[0-9]+ (failed|skipped|error)" "$RESULTS/parity.log"; }
    then
        verdict kernel PASS "$(detail parity passed)"
    else
        verdict kernel FAIL "$(detail parity) / build: $(detail build)"
    fi
fi
if wanted kernel_in_training; then
    mark
    if run kernel_in_training 120 "$PY" "${SMALL[@]}" --input-interface gf2 --train-iters 10 \
            --fixed-code-impl cuda --metrics-file "$RESULTS/kernel_in_training.jsonl" \
            && line=$(report final "$RESULTS/kernel_in_training.jsonl"); then
        verdict kernel_in_training PASS "$line"
    else
        verdict kernel_in_training FAIL "$(detail kernel_in_training)"
    fi
fi
if wanted fp16; then
    mark
    if run fp16 120 "$PY" "${SMALL[@]/--bf16/--fp16}" --input-interface binary --train-iters 20 \
            --metrics-file "$RESULTS/fp16.jsonl" && line=$(report fp16 "$RESULTS/fp16.jsonl"); then
        verdict fp16 PASS "$line"
    else
        verdict fp16 FAIL "${line:-$(detail fp16)}"
    fi
fi
if wanted input_layer; then
    mark
    table "Input layer (bench/bench_embedding.py)"
    run input_layer 150 "$PY" bench/bench_embedding.py --tokens 8192 --reps 10
    status=$?
    add "$(grep -E "^(#|\|)" "$RESULTS/input_layer.log" 2>/dev/null)"
    rows=$(grep -c "^| 8192 " "$RESULTS/input_layer.log" 2>/dev/null)
    verdict input_layer "$( ((status == 0)) && echo PASS || echo FAIL)" "${rows:-0} rows measured"
fi

add "" "done in $((SECONDS - START)) s"
echo
cat "$SUMMARY"
echo "logs: $RESULTS"
