#!/usr/bin/env bash
# The GPU check in one script, sized for one short slot (one H100/H200, 15 minutes with the
# machine's start, 10 per command) with room for a rerun, from the repository root:
#   bash bench/gpu_check.sh
# On a bare image (torch, Triton, numpy, transformers; no megatron-core, nothing fetchable) it
# first installs the wheels carried in .whl/ (filled here by `make gpu-wheels`, the list in
# bench/gpu_wheels.txt) with pip --no-index into a scratch target, puts that and the checkout
# on PYTHONPATH (tools/ and bench/ scripts import megatron_ext), and stops at once when an
# import fails. Steps, most valuable first, each with a time limit; the limits sum to 420 s:
#   install          the carried wheels, then the imports the steps need;
#   throughput       local layers at the 1.7B shape, SDPA, the recipe's levers that need no
#                    TE (fused AdamW, fused cross-entropy, fused SwiGLU), with gradient
#                    accumulation (GPU_CHECK_ACCUMULATION micro-batches per step, default 8,
#                    as the recipe): the binary arm, the learned arm, and the binary arm with
#                    each layer torch.compile'd (--torch-compile-layers, inductor); one table
#                    (bench/gpu_check_report.py) with each row's MFU under Megatron-LM's FLOP
#                    count and peak memory, then the fixed/learned ratio and the compiled
#                    row's gain with its compile time;
#   sdpa_parity      the GPU-only SDPA tests (pinned kernels, bf16 parity with the unfused path);
#   recipe_flags     the recipe's GPU flags at DP=1 (local layers, --use-distributed-optimizer
#                    --overlap-grad-reduce --overlap-param-gather), saving; then resume.
# Asked for by name only (GPU_CHECK_STEPS), not in the 420 s: convert (after recipe_flags:
# tools/convert_to_hf.py --validate of its checkpoint; the CPU rehearsal runs it), no_accum
# (the binary arm without accumulation, profiled for 2 steps: GPU kernel time by category),
# local_unfused (the unfused attention's row), te_bf16_fp8 (Transformer Engine bf16 then
# FP8, when TE imports), and the steps that passed on the first GPU run (bench/RESULTS.md):
# kernel, kernel_in_training, fp16, input_layer.
# GPU_CHECK_STEPS="throughput recipe_flags" runs only those (names as above, any order given;
# they run in the order above). Throughput: micro-batch GPU_CHECK_MICRO_BATCH (default 4) of
# 2048 tokens; with accumulation 5 steps, 3-5 counted (the compiled run compiles in step 1);
# without, 14 steps, 5-12 counted (13-14 profiled): total tokens over their total time, per
# GPU, with model TFLOP/s and MFU (Megatron-LM's FLOP count, dense bf16 peak) and peak
# allocated/reserved memory.
# Verdicts: a step passes when its commands exit 0 and no log holds a Traceback. Each verdict
# and table row lands in summary.md as soon as it is known, so a killed run keeps what ran.
# Budget: GPU_CHECK_BUDGET_S (default 420 s); a step that would start with less than 30 s left
# is recorded as skipped. What comes back: $OUT/gpu_check/ holds summary.md, logs.md (the
# last lines of every step's log) and the throughput runs' metrics files, nothing else;
# logs, checkpoints, the export and the traces stay in GPU_CHECK_WORK (default
# /tmp/fixedcode_gpu_check, emptied first). Without OUT, summary.md is in GPU_CHECK_WORK.
# GPU_CHECK_DRY_RUN=1 prints the plan (every command, its limit, their sum) and runs nothing.
# GPU_CHECK_REHEARSAL=1 runs every step's real command on CPU at a tiny shape (the install
# from GPU_CHECK_WHEELS; tests/integration/test_gpu_check.py does, from a clean copy, convert
# included), each within 5 times its limit, so the plumbing is never first tried on the GPU.
# PYTHON (default python3) runs everything.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD

PY=${PYTHON:-python3}
DRY=${GPU_CHECK_DRY_RUN:-0}
REHEARSAL=${GPU_CHECK_REHEARSAL:-0}
WORK=${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/fixedcode_gpu_check}
BACK=${OUT:+$OUT/gpu_check}  # what comes back (at most 8 small files)
rm -rf "$WORK"  # a rerun must not resume the previous run's checkpoints
mkdir -p "$WORK"
if [[ -n $BACK ]]; then rm -rf "$BACK"; mkdir -p "$BACK"; fi
SUMMARY=$WORK/summary.md
WHEELS=${GPU_CHECK_WHEELS:-$REPO/.whl}
SITE=$WORK/site  # the carried wheels' install target
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # one arch: the fastest build
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONUNBUFFERED=1
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-420}
# The rehearsal keeps the plan's limits and budget on a clock STRETCH times slower: the
# start-up of a process on a shared CPU is not the GPU machine's, and a loaded CI machine
# must not time a step out.
STRETCH=1
((REHEARSAL)) && STRETCH=5
PLANNED=0  # the sum of the limits of the commands planned (dry run) or started
STEPS=${GPU_CHECK_STEPS:-install throughput sdpa_parity recipe_flags}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

if [[ -n ${GPU_CHECK_HAVE_TE:-} ]]; then
    HAVE_TE=$GPU_CHECK_HAVE_TE  # for a dry run's plan
elif ((!REHEARSAL)) && "$PY" -c "import transformer_engine" 2>/dev/null; then HAVE_TE=1
else HAVE_TE=0; fi
MICRO=${GPU_CHECK_MICRO_BATCH:-4}
ACCUMULATION=${GPU_CHECK_ACCUMULATION:-8}
SKIP=4 UNTIL=12 ITERS=14              # without accumulation: 5-12 counted, 13-14 profiled
ACC_SKIP=2 ACC_UNTIL=5 ACC_ITERS=5    # with accumulation: 3-5 counted
if ((REHEARSAL)); then  # CPU, the tests' tiny model: the same commands, seconds each
    MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128
           --seq-length 32 --vocab-size 511 --device cpu)
    SHAPE=("${MODEL[@]}")
    MICRO=2 WORKERS=0 TOKENS="2 x 32"
    COMPILE=(--torch-compile-layers --torch-compile-backend eager)  # dynamo's capture only
else
    MODEL=(--preset smollm2-1.7b --seq-length 2048 --vocab-size 49151)
    SHAPE=(--num-layers 4 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 16
           --seq-length 1024 --vocab-size 49151)
    WORKERS=2 TOKENS="$MICRO x 2048"
    COMPILE=(--torch-compile-layers)  # inductor: Triton kernels
fi
COMMON=(--mock-data --tokenizer-type NullTokenizer --lr 3e-4 --lr-warmup-iters 2
        --log-interval 1 --eval-iters 0 --num-workers "$WORKERS" --bf16)
SMALL=(pretrain_fixedcode.py "${COMMON[@]}" "${SHAPE[@]}" --micro-batch-size 2
       --global-batch-size 8)
BIG=(pretrain_fixedcode.py "${COMMON[@]}" "${MODEL[@]}" --micro-batch-size "$MICRO")
NO_ACCUMULATION=(--global-batch-size "$MICRO" --train-iters "$ITERS")
WITH_ACCUMULATION=(--global-batch-size "$((MICRO * ACCUMULATION))" --train-iters "$ACC_ITERS")
RECIPE_GPU_FLAGS=(--transformer-impl local --use-distributed-optimizer --overlap-grad-reduce
                  --overlap-param-gather)
CKPT=$WORK/checkpoints

# run NAME LIMIT_S COMMAND...: run with a time limit (cut to what is left of the budget),
# output in $WORK/NAME.log. Status: the command's, 124 timed out, 125 budget spent, and 1
# when the log holds a Traceback whatever the status.
run() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - (SECONDS - START) / STRETCH))
    if ((left < 30)); then
        echo "budget spent before this step" >"$WORK/$name.log"
        return 125
    fi
    ((limit > left)) && limit=$left
    PLANNED=$((PLANNED + limit))
    echo "== $name (limit ${limit}s): $*"
    if ((DRY)); then
        return 0
    fi
    RAN+=("$name")
    timeout --signal=TERM --kill-after=15 "$((limit * STRETCH))" "$@" >"$WORK/$name.log" 2>&1
    local status=$?
    ((status == 124 || status == 137)) && echo "error: timed out after $((limit * STRETCH)) s" \
        >>"$WORK/$name.log"
    if ((status == 0)) && grep -q "Traceback" "$WORK/$name.log"; then
        return 1
    fi
    return $status
}
RAN=()

# detail NAME [PATTERN]: a line of NAME.log fit for a table cell: the last one matching
# PATTERN, else the last error line (an exception, "error:"), else the last line.
detail() {
    local line
    line=$(grep -E "${2:-^$}" "$WORK/$1.log" 2>/dev/null | tail -n 1)
    [[ -z $line ]] && line=$(grep -E "Error|error:|Killed" "$WORK/$1.log" 2>/dev/null \
                             | grep -v "Warning" | tail -n 1)
    [[ -z $line ]] && line=$(tail -n 1 "$WORK/$1.log" 2>/dev/null)
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

# tests_passed NAME: the pytest run NAME.log had no failure, error or (on a GPU) skip.
tests_passed() {
    ((DRY)) && return 0
    if ((REHEARSAL)); then
        ! grep -qE "[0-9]+ (failed|error)" "$WORK/$1.log"
    else
        ! grep -qE "[0-9]+ (failed|skipped|error)" "$WORK/$1.log"
    fi
}

# summary.md = the machine, the steps' verdicts, then the tables; rewritten (atomically)
# whenever a verdict or a row is added, and copied back with the trimmed logs.
refresh() {
    cat "$WORK/head.md" "$WORK/steps.md" "$WORK/sections.md" >"$SUMMARY.tmp" 2>/dev/null
    mv "$SUMMARY.tmp" "$SUMMARY"
    [[ -z $BACK ]] && return 0
    cp "$SUMMARY" "$BACK/summary.md"
    local name
    for name in "${RAN[@]}"; do
        printf '## %s\n\n```\n' "$name"
        tail -n 25 "$WORK/$name.log" 2>/dev/null | cut -c1-300
        printf '```\n\n'
    done >"$BACK/logs.md"
}
# add TEXT...: lines for the tables part of summary.md.
add() { printf '%s\n' "$@" >>"$WORK/sections.md"; refresh; }
# mark: a step starts (its clock). verdict STEP PASS|FAIL|SKIP DETAIL: the step's line on
# stdout and its row in summary.md, at once (DRY in a dry run).
mark() { T0=$SECONDS; }
verdict() {
    local v=$2
    ((DRY)) && [[ $v == PASS ]] && v=DRY
    printf '[gpu_check] %-4s %-18s %s (%s s)\n' "$v" "$1" "$3" "$((SECONDS - T0))"
    printf '| %s | %s | %s | %s |\n' "$1" "$v" "$3" "$((SECONDS - T0))" >>"$WORK/steps.md"
    refresh
}
# table TITLE [HEADER]: open a table (its rows are added as they are measured).
table() { add "" "### $1" "" ${2:+"$2"}; }
SPEED_HEADER="| run | tokens/s per GPU | TFLOP/s per GPU | MFU, Megatron-LM's count (bf16 peak) | MFU (FP8 peak) | peak allocated GiB | peak reserved GiB | iterations |
|---|---:|---:|---:|---:|---:|---:|---:|"
# speed NAME SKIP UNTIL: the throughput row of run NAME, appended to summary.md; its metrics
# file comes back.
speed() {
    add "$(report speed "$1" "$WORK/$1.jsonl" --skip "$2" --until "$3")"
    if [[ -n $BACK ]] && ((!DRY)); then cp "$WORK/$1.jsonl" "$BACK/" 2>/dev/null; fi
    return 0
}

{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    echo '```'
    if ((DRY)); then
        echo "dry run: nothing executed"
    elif ((REHEARSAL)); then
        echo "rehearsal on CPU ($(nproc) cores), tiny shape: the plumbing, not GPU figures"
    else
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    fi
    echo '```'
    echo
    echo "Budget ${BUDGET} s; steps: $STEPS"
    echo
} >"$WORK/head.md"
printf '| step | verdict | detail | s |\n|---|---|---|---:|\n' >"$WORK/steps.md"
: >"$WORK/sections.md"
refresh
cat "$SUMMARY"

# 1. The carried wheels, then the imports every step needs: a failure stops the check here.
IMPORTS="${GPU_CHECK_IMPORTS:-} torch megatron.core transformers psutil megatron_ext"
SHOW_IMPORTS="import importlib, sys; [print(n, getattr(m, '__version__', ''), m.__file__) for n \
in sys.argv[1:] for m in [importlib.import_module(n)]]; import torch; print('torch CUDA', \
torch.version.cuda, 'available', torch.cuda.is_available())"
if wanted install; then
    mark
    wheels=()
    for wheel in "$WHEELS"/*.whl; do [[ -e $wheel ]] && wheels+=("$wheel"); done
    ((DRY)) && ((!${#wheels[@]})) && wheels=("$WHEELS/*.whl")
    ok=1
    if ((${#wheels[@]})); then
        run install_wheels 10 "$PY" -m pip install --no-index --no-deps --no-compile \
            --disable-pip-version-check -q --target "$SITE" "${wheels[@]}" || ok=0
    fi
    # shellcheck disable=SC2086  # one module name per word
    if ((ok)) && run imports 20 "$PY" -c "$SHOW_IMPORTS" $IMPORTS; then
        verdict install PASS "${#wheels[@]} wheels; $(detail imports "^megatron.core ")"
    else
        verdict install FAIL "$(detail "$( ((ok)) && echo imports || echo install_wheels)")"
        echo "[gpu_check] stopped: an import the steps need fails (the install step's log" \
             "is in logs.md)"
        exit 1
    fi
fi

# 2. Throughput of local layers at the 1.7B shape with the recipe's accumulation: the binary
#    arm, the learned arm, the binary arm compiled; then the fixed/learned ratio and the gain.
LOCAL_RUN=("$PY" "${BIG[@]}" --transformer-impl local)
EAGER=binary_accum$ACCUMULATION LEARNED=learned_accum$ACCUMULATION
COMPILED=binary_accum${ACCUMULATION}_compiled
# ratio LABEL BASE OTHER: the line comparing run OTHER with run BASE, when both were measured.
ratio() {
    if ((DRY)); then add "$1: (dry run)"; return 0; fi
    if [[ -f $WORK/$2.jsonl && -f $WORK/$3.jsonl ]]; then
        add "$(report ratio "$WORK/$2.jsonl" "$WORK/$3.jsonl" --label "$1" --skip $ACC_SKIP \
            --until $ACC_UNTIL)"
    else
        add "$1: not measured ($2 or $3 failed)"
    fi
}
if wanted throughput; then
    mark
    table "Local layers, SDPA, $TOKENS tokens per micro-batch, $ACCUMULATION per step (steps \
$((ACC_SKIP + 1))-$ACC_UNTIL of $ACC_ITERS counted)" "$SPEED_HEADER"
    ok=1
    # each: NAME LIMIT ARGS...; the compiled run compiles in step 1, before those counted
    for row in "$EAGER 90 --input-interface binary" "$LEARNED 90 --input-interface learned" \
            "$COMPILED 115 --input-interface binary ${COMPILE[*]}"; do
        read -r name limit arm <<<"$row"
        # shellcheck disable=SC2086  # the arm's flags, one per word
        if run "$name" "$limit" "${LOCAL_RUN[@]}" $arm "${WITH_ACCUMULATION[@]}" \
                --metrics-file "$WORK/$name.jsonl"; then
            speed "$name" $ACC_SKIP $ACC_UNTIL
        else
            rm -f "$WORK/$name.jsonl"  # a failed run's records make no row and no ratio
            add "| $name | not measured: $(detail "$name") |"
            ok=0
        fi
    done
    add ""
    ratio "fixed/learned" "$LEARNED" "$EAGER"
    ratio "compiled gain" "$EAGER" "$COMPILED"
    add "compile time ($COMPILED, ${COMPILE[*]}): $(detail "$COMPILED" "torch.compile: ")"
    if ((ok)); then
        verdict throughput PASS "$(detail "$EAGER" "micro-batches per step")"
    else
        verdict throughput FAIL "binary: $(detail "$EAGER") / learned: $(detail "$LEARNED") / \
compiled: $(detail "$COMPILED")"
    fi
fi

# 3. The pinned SDPA kernels run and equal the unfused attention in bf16 (GPU-only tests).
if wanted sdpa_parity; then
    mark
    if run sdpa_parity 25 "$PY" -m pytest -q -p no:cacheprovider \
            tests/integration/test_attention.py -k gpu && tests_passed sdpa_parity; then
        verdict sdpa_parity PASS "$(detail sdpa_parity "passed|skipped")"
    else
        verdict sdpa_parity FAIL "$(detail sdpa_parity "passed|failed")"
    fi
fi

# 4. The recipe's GPU-only flags at DP=1: train 3 of 6 iterations and save, resume to 6;
#    asked for by name, convert the checkpoint and validate the conversion.
if wanted recipe_flags || wanted convert; then
    mark
    RECIPE_RUN=("$PY" "${SMALL[@]}" "${RECIPE_GPU_FLAGS[@]}" --input-interface binary
                --train-iters 6 --save "$CKPT" --load "$CKPT" --save-interval 3
                --metrics-file "$WORK/recipe_flags.jsonl")
    if run recipe_flags 40 "${RECIPE_RUN[@]}" --exit-interval 3; then
        verdict recipe_flags PASS "${RECIPE_GPU_FLAGS[*]}: $(detail recipe_flags "saved checkpoint")"
        mark
        if run resume 30 "${RECIPE_RUN[@]}" && line=$(report final "$WORK/recipe_flags.jsonl")
        then
            verdict resume PASS "from iteration 3: $line"
        else
            verdict resume FAIL "$(detail resume)"
        fi
        if wanted convert; then
            mark
            if run convert 30 "$PY" tools/convert_to_hf.py --load "$CKPT" \
                    --output "$WORK/hf" --validate; then
                verdict convert PASS "$(detail convert "validate: max")"
            else
                verdict convert FAIL "$(detail convert)"
            fi
        fi
    else
        verdict recipe_flags FAIL "$(detail recipe_flags)"
        verdict resume SKIP "no checkpoint"
        wanted convert && verdict convert SKIP "no checkpoint"
    fi
fi

# 5. Asked for by name: the binary arm without accumulation, profiled; the unfused attention.
if wanted no_accum; then
    mark
    table "Local layers, SDPA, binary arm, $TOKENS tokens, one micro-batch per step (steps \
$((SKIP + 1))-$UNTIL counted)" "$SPEED_HEADER"
    if run binary_no_accum 70 "${LOCAL_RUN[@]}" --input-interface binary "${NO_ACCUMULATION[@]}" \
            --metrics-file "$WORK/binary_no_accum.jsonl" --profile --use-pytorch-profiler \
            --profile-step-start $UNTIL --profile-step-end $ITERS \
            --tensorboard-dir "$WORK/profile"; then
        speed binary_no_accum $SKIP $UNTIL
        verdict no_accum PASS "row in the table"
    else
        verdict no_accum FAIL "$(detail binary_no_accum)"
    fi
    table "Profile of binary_no_accum, iterations $((UNTIL + 1))-$ITERS, kernels"
    if ((DRY)); then add "(dry run)"; else add "$("$PY" bench/gpu_check_report.py profile \
        "$WORK/profile" 2>&1 | tail -n 12)"; fi
fi
if wanted local_unfused; then
    mark
    table "Local layers, unfused attention, binary arm" "$SPEED_HEADER"
    if run binary_unfused 130 "${LOCAL_RUN[@]}" --input-interface binary \
            "${WITH_ACCUMULATION[@]}" --attention-backend unfused \
            --metrics-file "$WORK/binary_unfused.jsonl"; then
        speed binary_unfused $ACC_SKIP $ACC_UNTIL
        verdict local_unfused PASS "row in the table"
    else
        verdict local_unfused FAIL "$(detail binary_unfused)"
    fi
fi

# 6. Transformer Engine layers: bf16, then FP8, at the 1.7B shape (when TE imports).
if wanted te_bf16_fp8; then
    mark
    if ((!HAVE_TE)); then
        verdict te_bf16_fp8 SKIP "Transformer Engine not importable"
    else
        table "Transformer Engine layers, binary arm, $TOKENS tokens per micro-batch" \
            "$SPEED_HEADER"
        # NVTE_DEBUG: TE logs the attention backend it selects.
        TE_RUN=(env NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=1 "$PY" "${BIG[@]}" "${NO_ACCUMULATION[@]}"
                --transformer-impl transformer_engine --input-interface binary)
        run te_binary_bf16 170 "${TE_RUN[@]}" --metrics-file "$WORK/te_binary_bf16.jsonl"
        BF16=$?
        ((BF16 == 0)) && speed te_binary_bf16 $SKIP $UNTIL
        run te_binary_fp8 170 "${TE_RUN[@]}" --fp8-format hybrid \
            --metrics-file "$WORK/te_binary_fp8.jsonl"
        FP8=$?
        ((FP8 == 0)) && speed te_binary_fp8 $SKIP $UNTIL
        backend=$(detail te_binary_bf16 "[Ss]elected backend|backend = ")
        if ((BF16 == 0 && FP8 == 0)) && line=$(report compare "$WORK/te_binary_bf16.jsonl" \
                "$WORK/te_binary_fp8.jsonl"); then
            verdict te_bf16_fp8 PASS "$line; attention: $backend"
        else
            verdict te_bf16_fp8 FAIL "${line:-bf16: $(detail te_binary_bf16) / FP8: $(detail te_binary_fp8)}"
        fi
    fi
fi

# 7. Passed on the first GPU run: the kernel, its use in training, fp16, the input layer.
if wanted kernel; then
    mark
    if run build 240 "$PY" -m megatron_ext.codes.cuda_extension \
            && run parity 120 "$PY" -m pytest -q -p no:cacheprovider \
                tests/integration/test_cuda_kernel.py -k equals_reference_on_gpu \
            && tests_passed parity; then
        verdict kernel PASS "$(detail parity passed)"
    else
        verdict kernel FAIL "$(detail parity) / build: $(detail build)"
    fi
fi
if wanted kernel_in_training; then
    mark
    if run kernel_in_training 120 "$PY" "${SMALL[@]}" --input-interface gf2 --train-iters 10 \
            --fixed-code-impl cuda --metrics-file "$WORK/kernel_in_training.jsonl" \
            && line=$(report final "$WORK/kernel_in_training.jsonl"); then
        verdict kernel_in_training PASS "$line"
    else
        verdict kernel_in_training FAIL "$(detail kernel_in_training)"
    fi
fi
if wanted fp16; then
    mark
    if run fp16 120 "$PY" "${SMALL[@]/--bf16/--fp16}" --input-interface binary --train-iters 20 \
            --metrics-file "$WORK/fp16.jsonl" && line=$(report fp16 "$WORK/fp16.jsonl"); then
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
    add "$(grep -E "^(#|\|)" "$WORK/input_layer.log" 2>/dev/null)"
    rows=$(grep -c "^| 8192 " "$WORK/input_layer.log" 2>/dev/null)
    verdict input_layer "$( ((status == 0)) && echo PASS || echo FAIL)" "${rows:-0} rows measured"
fi

((DRY)) && echo "limits sum: ${PLANNED} s (budget ${BUDGET} s)"
add "" "done in $((SECONDS - START)) s"
echo
cat "$SUMMARY"
