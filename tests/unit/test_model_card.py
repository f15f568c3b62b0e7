"""The model card's metadata names the training machine's files by name only (a card meant for
the Hub publishes no directory layout), and its licence only as a Hub identifier."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_ext.config.run_config import RunConfig
from megatron_ext.hf.model_card import card_body, card_metadata, check_license, render
from megatron_ext.runtime.errors import FlagError

RECORD = {"arm": "learned", "input_table": "trained"}
MODEL = dataclasses.replace(RunConfig().model, seq_length=32, num_layers=2, hidden_size=64,
                            num_attention_heads=4, ffn_hidden_size=128,
                            max_position_embeddings=32)
TRAINABLE = {"total": 10, "input": 2, "backbone": 6, "head": 2}


def metadata(saved: dict, license=None) -> dict:
    return card_metadata(MODEL, {"args": saved, "iteration": 5}, RECORD,
                         stock=True, trainable=TRAINABLE, stored=10, license=license)


def test_the_card_names_the_data_and_tokenizer_files_without_their_directories():
    saved = {"tokenizer_type": "SentencePieceTokenizer",
             "tokenizer_model": "/lustre/team/alice/tok/spm.model", "tokenizer_sha256": "ab" * 32,
             "train_data_path": ["0.3", "/lustre/team/alice/data/web_text_document", "0.7",
                                 "/lustre/team/alice/data/code_text_document"],
             "valid_data_path": ["/lustre/team/alice/data/valid_text_document"],
             "data_args_path": "/lustre/team/alice/blend.txt"}
    meta = metadata(saved)
    fc = meta["fixedcode"]
    assert fc["tokenizer"] == {"type": "SentencePieceTokenizer", "model": "spm.model",
                               "sha256": "ab" * 32}
    assert fc["training"]["data"] == {
        "train_data_path": ["0.3", "web_text_document", "0.7", "code_text_document"],
        "valid_data_path": ["valid_text_document"], "data_args_path": "blend.txt"}
    text = render(meta, card_body("m", MODEL, 512, meta))
    assert "/lustre" not in text and "web_text_document" in text


def test_no_licence_is_stated_unless_given_and_then_only_a_hub_identifier():
    assert "license" not in metadata({})
    assert metadata({}, license="cc-by-4.0")["license"] == "cc-by-4.0"
    assert check_license("llama3.1") == "llama3.1"
    for bad in ("FILL-IN", "Apache-2.0", "apache 2.0", ""):
        with pytest.raises(FlagError, match=f"--license {bad}: not a Hugging Face Hub licence"):
            check_license(bad)
