#!/usr/bin/env bash
# Train one arm of the paper-shape recipe on one node of 8 GPUs:
#   bash examples/smollm2_1p7b/train.sh {learned|binary|gf2|permuted|random} [RUN_DIR]
# Resumes from RUN_DIR/ARM/checkpoints when it holds a checkpoint. For Slurm (many nodes,
# preemption, requeue) use tools/submit.py with the same recipe.args.
set -euo pipefail
usage="usage: train.sh {learned|binary|gf2|permuted|random} [RUN_DIR]"
arm=${1:?$usage}
run_dir=${2:-runs/smollm2_1p7b}
case "$arm" in learned|binary|gf2|permuted|random) ;; *) echo "error: unknown arm '$arm'; $usage" >&2; exit 2;; esac
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# The recipe's flags, comments dropped.
mapfile -t recipe < <(sed -e 's/#.*//' "$here/recipe.args" | tr -s ' \t' '\n' | sed '/^$/d')
mkdir -p "$run_dir/$arm"
# One CUDA work queue per GPU, as Megatron-LM requires for overlapping tensor-parallel
# communication with computation on Hopper (slurm/fixedcode.sbatch sets it too).
export CUDA_DEVICE_MAX_CONNECTIONS=1
exec torchrun --nproc-per-node "${GPUS_PER_NODE:-8}" "$repo/pretrain_fixedcode.py" \
    "${recipe[@]}" \
    --input-interface "$arm" \
    --save "$run_dir/$arm/checkpoints" --load "$run_dir/$arm/checkpoints" \
    --tensorboard-dir "$run_dir/$arm/tensorboard" \
    --exit-signal-handler
