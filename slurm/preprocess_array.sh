#!/usr/bin/env bash
# Tokenize a corpus of many shards on N nodes: a Slurm array of N tasks, task I running
# tools/preprocess_data.py --shard I/N (its contiguous run of the input files:
# megatron_ext/preprocess/shards.py) into PREFIX.shard-IIIII, then a merge job, started once
# every task has succeeded (afterok), that joins the shards' datasets in shard order with
# tools/merge_datasets.py into PREFIX_{key}_document.bin/.idx: the bytes one run over every
# input writes. Run it from the repository root, on a login node:
#
#   slurm/preprocess_array.sh N PREFIX [tools/preprocess_data.py flags but --output-prefix]
#   slurm/preprocess_array.sh 16 data/fineweb-edu --input 'downloads/fineweb-edu-dedup/*.parquet' \
#       --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizers/smollm2 \
#       --append-eod
#
# Each task gets --workers $SLURM_CPUS_PER_TASK (a --workers among the flags wins). The
# environment: SBATCH_ARGS (sbatch options for every job: --partition, --account, --time,
# --cpus-per-task), PYTHON (default .venv/bin/python), JSON_KEYS (the --json-keys given;
# default text). Logs: PREFIX.shard-IIIII.log and PREFIX.merge.log. After a time limit or a
# failure, submit the same command with --resume among the flags: each task keeps its complete
# parts (PREFIX.shard-IIIII.work/), a finished task's dataset is rewritten identically. Prints
# the two job ids.
set -euo pipefail

usage() { echo "usage: $0 NODES OUTPUT_PREFIX [tools/preprocess_data.py flags]" >&2; exit 2; }
(( $# >= 2 )) || usage
nodes=$1 prefix=$2
shift 2
[[ $nodes =~ ^[1-9][0-9]*$ ]] || usage
PYTHON=${PYTHON:-.venv/bin/python}
read -r -a sbatch_args <<< "${SBATCH_ARGS:-}"
read -r -a keys <<< "${JSON_KEYS:-text}"

shard() { printf '%s.shard-%05d' "$prefix" "$1"; }
flags=$(printf ' %q' "$@")
array=$(sbatch --parsable "${sbatch_args[@]}" --job-name=preprocess --array="0-$((nodes - 1))" \
    --output="$prefix.shard-%5a.log" --wrap "cd $(printf %q "$PWD") && exec $PYTHON \
-m tools.preprocess_data --workers \${SLURM_CPUS_PER_TASK:-1} --shard \
\$SLURM_ARRAY_TASK_ID/\$SLURM_ARRAY_TASK_COUNT --output-prefix \
$(printf %q "$prefix").shard-\$(printf %05d \$SLURM_ARRAY_TASK_ID)$flags")

merges="cd $(printf %q "$PWD")"
for key in "${keys[@]}"; do
    inputs=()
    for (( i = 0; i < nodes; i++ )); do inputs+=("$(shard "$i")_${key}_document"); done
    merges+=" && $PYTHON -m tools.merge_datasets --input$(printf ' %q' "${inputs[@]}") \
--output-prefix $(printf %q "${prefix}_${key}_document")"
done
merge=$(sbatch --parsable "${sbatch_args[@]}" --job-name=preprocess-merge \
    --dependency="afterok:${array%%;*}" --output="$prefix.merge.log" --wrap "$merges")
echo "shards: job $array (array 0-$((nodes - 1))); merge: job $merge (after all succeed)"
