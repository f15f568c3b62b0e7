"""The model card (``README.md``) of an exported model, ready to publish on the Hugging Face Hub:
YAML metadata (library, the licence given as a Hub identifier or none, tags, and under
``fixedcode`` the arm and its code, the tokenizer and the training data by file name (and the
tokenizer's sha256: a card meant for the Hub publishes no directory of the training machine),
the training tokens, the parameter counts) and a body saying what the model is and how to load it. :mod:`.export` writes it;
tools/evaluate.py records its results in it (:func:`record_evaluation`): a table between the
card's evaluation markers and the Hub's ``model-index``, both made from the rows kept in the
metadata, so that a second evaluation replaces its tasks' rows instead of adding to them.
Every write is atomic.
"""

from __future__ import annotations

import os
from typing import Optional

import yaml
from huggingface_hub import EvalResult
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

from ..config.model_config import ModelConfig
from ..config.recipes import is_weight
from ..runtime.errors import DataError, FlagError
from ..runtime.files import write_text
from .eval_report import PERCENT

CARD = "README.md"
# The Hugging Face Hub's licence identifiers (huggingface.co/docs/hub/repositories-licenses):
# a card's ``license`` must be one (``other`` with ``license_name``/``license_link`` for the rest).
HUB_LICENSES = (
    "apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m",
    "bigscience-bloom-rail-1.0", "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0",
    "bsd", "bsd-2-clause", "bsd-3-clause", "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0",
    "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0", "cc-by-sa-4.0",
    "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0",
    "cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0",
    "epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1", "eupl-1.2", "agpl-3.0", "gfdl", "gpl",
    "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0", "isc", "h-research",
    "intel-research", "lppl-1.3c", "ms-pl", "apple-ascl", "apple-amlr", "mpl-2.0", "odc-by",
    "odbl", "openrail++", "osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib",
    "pddl", "lgpl-lr", "deepfloyd-if-license", "fair-noncommercial-research-license",
    "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "llama4", "gemma", "unknown",
    "other")
EVALUATION_START = "<!-- fixedcode:evaluation -->"
EVALUATION_END = "<!-- /fixedcode:evaluation -->"
NOT_EVALUATED = ("Not evaluated yet: `tools/evaluate.py` writes its results here and in the "
                 "metadata's `model-index`.")
# The saved args that name the training data (as the run was given them; the card keeps
# their file names).
DATA_ARGS = ("data_path", "train_data_path", "valid_data_path", "test_data_path",
             "data_args_path", "per_split_data_args_path")
# The saved args that name the tokenizer: its files (by name) and its sha256.
TOKENIZER_FILES = {"tokenizer_model": "model", "vocab_file": "vocab_file",
                   "merge_file": "merge_file"}
# The Hub's names of the tasks' datasets.
TASK_NAMES = {"hellaswag": "HellaSwag", "piqa": "PIQA", "lambada_openai": "LAMBADA (OpenAI)"}


def check_license(license: str) -> str:
    """``license`` if it is a Hub licence identifier, else a :class:`FlagError` naming it."""
    if license not in HUB_LICENSES:
        raise FlagError(f"--license {license}: not a Hugging Face Hub licence identifier "
                        f"(e.g. apache-2.0, mit, cc-by-4.0, llama3.1; 'other' for the rest: "
                        f"huggingface.co/docs/hub/repositories-licenses)")
    return license


def file_name(path: str) -> str:
    """What a card says of a path of the training machine: the file's name, no directory."""
    return os.path.basename(os.path.normpath(str(path)))


def _data_names(value):
    """A data flag's values with each path reduced to its file name (weights kept)."""
    if isinstance(value, (list, tuple)):
        return [v if is_weight(str(v)) else file_name(v) for v in value]
    return file_name(value)


def card_metadata(model_config: ModelConfig, common: dict, record: dict, *, stock: bool,
                  trainable: dict, stored: int, license: Optional[str] = None) -> dict:
    """The card's YAML metadata. ``model_config``: the checkpoint's run's model config; ``common``:
    the checkpoint's common state (its args as saved: the data and tokenizer as the run was
    given them, its paths as written, not as a reader resolves them; the train state, the
    provenance); ``record``: :func:`.convert.input_record`; ``stock``:
    whether the export is a stock ``LlamaForCausalLM``; ``trainable``: the trained model's
    parameters by part (model.param_count.count_parameters); ``stored``: the weights the
    export holds; ``license``: a Hub identifier (:func:`check_license`), or None for no
    ``license`` key."""
    saved = common["args"]
    samples = int(common.get("consumed_train_samples", 0))
    data = {k: _data_names(saved[k]) for k in DATA_ARGS if saved.get(k)}
    tokenizer = {"type": saved.get("tokenizer_type"),
                 **{name: file_name(saved[k]) for k, name in TOKENIZER_FILES.items()
                    if saved.get(k)}}
    if saved.get("tokenizer_sha256"):
        tokenizer["sha256"] = saved["tokenizer_sha256"]
    model = {"arm": record["arm"], "input_table": record["input_table"]}
    if "code" in record:
        model.update(code=record["code"], code_projection=record["code_projection"])
    model["export"] = ("LlamaForCausalLM" + (" (the code as the table embed_tokens.weight)"
                                             if "code" in record else "")
                       if stock else "FixedCodeLlamaForCausalLM (trust_remote_code=True)")
    tags = ["fixedcode", "llama", "megatron-core", f"arm-{record['arm']}"]
    if "code" in record:
        tags.append("fixed-input-code")
    return {
        "library_name": "transformers",
        **({"license": license} if license else {}),
        "pipeline_tag": "text-generation",
        "tags": tags,
        "fixedcode": {
            **model,
            "tokenizer": tokenizer,
            "training": {"iteration": int(common.get("iteration", 0)), "samples": samples,
                         "sequence_length": int(model_config.seq_length),
                         "tokens": samples * int(model_config.seq_length),
                         "data": data or ("mock data (--mock-data)" if saved.get("mock_data")
                                          else "not recorded")},
            "parameters": {"trainable": dict(trainable), "stored": int(stored)},
            "software": {"fixedcode": common.get("fixedcode_version"),
                         "megatron_core": common.get("megatron_core_version")},
        },
    }


def _count(n: int) -> str:
    return f"{n:,}"


def card_body(name: str, model: ModelConfig, padded_vocab_size: int, metadata: dict) -> str:
    """The card's text below the metadata (``model``: the run's model config)."""
    fc = metadata["fixedcode"]
    stock = fc["export"].startswith("LlamaForCausalLM")
    trainable, training = fc["parameters"]["trainable"], fc["training"]
    groups = model.num_query_groups or model.num_attention_heads
    what = (f"the input of the first layer is the `{fc['arm']}` fixed code of the token id "
            f"({fc['code']}; {fc['input_table']})" if "code" in fc
            else f"its input table is {fc['arm']} ({fc['input_table']})")
    data = training["data"]
    data = (data if isinstance(data, str) else
            "; ".join(f"`--{k.replace('_', '-')}` " + " ".join(map(str, v if isinstance(v, list)
                                                               else [v]))
                      for k, v in data.items()))
    tokenizer = fc["tokenizer"]
    remote = "" if stock else ", trust_remote_code=True"
    lines = [
        f"# {name}", "",
        f"A decoder-only language model trained with fixedcode (Megatron-Core): {what}.", "",
        "| | |", "|---|---|",
        f"| arm | `{fc['arm']}` |",
        f"| export | {fc['export']} |",
        f"| shape | {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_attention_heads} heads ({groups} key/value groups), FFN "
        f"{model.ffn_hidden_size}, vocabulary {padded_vocab_size} (padded), context "
        f"{model.max_position_embeddings} |",
        f"| trainable parameters | {_count(trainable['total'])} (input "
        f"{_count(trainable['input'])}, backbone {_count(trainable['backbone'])}, head "
        f"{_count(trainable['head'])}) |",
        f"| weights in this export | {_count(fc['parameters']['stored'])} |",
        f"| training | iteration {training['iteration']}: {_count(training['samples'])} "
        f"sequences of {training['sequence_length']} tokens = {_count(training['tokens'])} "
        f"tokens |",
        f"| data | {data} |",
        f"| tokenizer | {tokenizer.get('type', '?')}"
        + (f" `{tokenizer['model']}`" if "model" in tokenizer else "")
        + (f" (sha256 {tokenizer['sha256'][:12]}…)" if "sha256" in tokenizer else "") + " |",
        f"| software | fixedcode {fc['software']['fixedcode']}, megatron-core "
        f"{fc['software']['megatron_core']} |", "",
        "## Use", "",
        "```python",
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{name}"{remote}, dtype=torch.bfloat16)',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}"{remote})',
        "```", "",
        ("A stock `LlamaForCausalLM`: no code from this folder runs, and what serves a Llama "
         f"folder serves it (e.g. `vllm serve {name}`)." if stock else
         "`FixedCodeLlamaForCausalLM` computes the code in every forward: its code "
         "(`modeling_fixedcode.py`, `configuration_fixedcode.py`) is in this folder, hence "
         "`trust_remote_code=True`. Inference engines take only the stock export "
         "(`tools/convert_to_hf.py --as-table`)."), "",
        "## Evaluation", "", EVALUATION_START, NOT_EVALUATED, EVALUATION_END, "",
        "## Licence", "",
        (f"`{metadata['license']}` (the metadata's `license`)." if metadata.get("license") else
         "Not stated: add `license:` (a Hub licence identifier) to the metadata above before "
         "publishing, or export with `--license`; it follows from the training data's "
         "licences."), "",
    ]
    return "\n".join(lines)


def render(metadata: dict, body: str) -> str:
    return ("---\n" + yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True, width=100)
            + "---\n\n" + body.lstrip("\n"))


def write_card(hf_dir: str, name: str, model: ModelConfig, padded_vocab_size: int,
               metadata: dict) -> str:
    """Write ``hf_dir/README.md`` (:func:`card_body`'s arguments); its path."""
    path = os.path.join(hf_dir, CARD)
    write_text(path, render(metadata, card_body(name, model, padded_vocab_size, metadata)))
    return path


def read_card(path: str) -> tuple[dict, str]:
    """``(metadata, body)`` of a card with YAML metadata; :class:`DataError` naming the file
    when it has none or it does not parse."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, sep, body = text[4:].partition("\n---\n") if text.startswith("---\n") else ("", "", "")
    try:
        metadata = yaml.safe_load(head) if sep else None
    except yaml.YAMLError as e:
        raise DataError(f"{path}: its YAML metadata does not parse ({e})") from None
    if not isinstance(metadata, dict):
        raise DataError(f"{path}: no YAML metadata between '---' lines at its top")
    return metadata, body


def evaluation_rows(report: dict, hf_dir: str) -> list[dict]:
    """The rows of ``hf_dir``'s model in eval_report's ``report`` as the card keeps them: per
    (task, metric), the value (accuracies in %), its standard error, lm-eval's task version,
    the few-shot setting, the documents scored and the official dataset."""
    model = next(m for m in report["models"] if m["path"] == hf_dir)
    settings = report["settings"]
    rows = []
    for row in report["rows"]:
        values, task = row["models"][hf_dir], row["task"]
        if values is None:
            continue
        dataset = report["tasks"][task]
        rows.append({"task": task, "metric": row["metric"], "value": round(values["value"], 4),
                     "stderr": None if values["stderr"] is None else round(values["stderr"], 4),
                     "version": str(model["versions"].get(task)),
                     "num_fewshot": int(model["n_shot"].get(task, 0)),
                     "documents": int(model["n_samples"][task]["effective"]),
                     "dataset": dataset["path"], "split": dataset["split"],
                     "lm_eval": report["lm_eval_version"], "dtype": settings["dtype"],
                     "date": report["date"]})
    return rows


def _evaluation_table(rows: list[dict]) -> str:
    lines = ["| task | version | few-shot | metric | value | ± stderr | documents | lm-eval | "
             "dtype | date |", "|---|---|---:|---|---:|---:|---:|---|---|---|"]
    for r in rows:
        unit = " (%)" if r["metric"] in PERCENT else ""
        stderr = "—" if r["stderr"] is None else f"{r['stderr']:.2f}"
        lines.append(f"| {r['task']} | {r['version']} | {r['num_fewshot']} | {r['metric']}{unit} "
                     f"| {r['value']:.2f} | {stderr} | {_count(r['documents'])} | {r['lm_eval']} "
                     f"| {r['dtype']} | {r['date']} |")
    lines += ["", "Written by `tools/evaluate.py` (lm-eval's own task definitions; ± is its "
              "bootstrap standard error, one standard error)."]
    return "\n".join(lines)


def _model_index(name: str, rows: list[dict], kept: list) -> list:
    results = list(kept)
    for r in rows:
        shots = f"{r['num_fewshot']}-shot"
        results.append(EvalResult(
            task_type="text-generation", task_name="Text Generation",
            dataset_type=r["dataset"], dataset_name=f"{TASK_NAMES.get(r['task'], r['task'])} "
            f"({shots}, {r['documents']} documents)", dataset_split=r["split"],
            dataset_args={"num_few_shot": r["num_fewshot"]}, metric_type=r["metric"],
            metric_value=r["value"],
            metric_name=r["metric"] + (" (%)" if r["metric"] in PERCENT else "")))
    return eval_results_to_model_index(name, results) if results else []


def record_evaluation(hf_dir: str, rows: list[dict]) -> Optional[str]:
    """Write ``rows`` (:func:`evaluation_rows`) into ``hf_dir``'s card: they replace the rows
    of their tasks kept in the metadata (``fixedcode.evaluation``), and the card's table and
    ``model-index`` are made anew from what is kept (a ``model-index`` entry of another
    dataset, added by hand, stays). Returns the card's path, or None when ``hf_dir`` has no
    card of this exporter (a card without the evaluation markers is left as it is)."""
    path = os.path.join(hf_dir, CARD)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        if EVALUATION_START not in f.read():
            return None
    metadata, body = read_card(path)
    fc = metadata.setdefault("fixedcode", {})
    tasks = {r["task"] for r in rows}
    kept = [r for r in fc.get("evaluation", []) if r["task"] not in tasks] + rows
    order = {task: i for i, task in enumerate(TASK_NAMES)}
    kept.sort(key=lambda r: (order.get(r["task"], len(order)), r["task"]))
    fc["evaluation"] = kept
    ours = {r["dataset"] for r in kept}
    others = []
    if metadata.get("model-index"):
        _, results = model_index_to_eval_results(metadata["model-index"])
        others = [e for e in results if e.dataset_type not in ours]
    name = os.path.basename(os.path.abspath(hf_dir))
    metadata["model-index"] = _model_index(name, kept, others)
    before, _, rest = body.partition(EVALUATION_START)
    _, _, after = rest.partition(EVALUATION_END)
    body = before + EVALUATION_START + "\n" + _evaluation_table(kept) + "\n" + EVALUATION_END + after
    write_text(path, render(metadata, body))
    return path
