"""Tokenizer files of an export: ``AutoTokenizer.from_pretrained(HF_DIR)`` then encodes text
exactly as the training tokenizer (:mod:`megatron_ext.datasets.tokenizer`) did, adding no BOS/EOS.

* ``NullTokenizer``: no files (the model takes token ids); a warning says so.
* ``SentencePieceTokenizer``: a ``tokenizer.json`` built from the ``.model``'s own settings
  (normalizer, dummy prefix, unigram or BPE pieces, byte fallback) by transformers'
  ``SpmConverter.build_tokenizer_from_spm_proto``, with ``split_special_tokens`` (like
  sentencepiece, it does not read ``</s>`` etc. out of the text). One known difference: a
  unigram model's lattice still matches a control or byte piece written literally in the
  text (``"</s>"``, ``"<0x41>"``), which sentencepiece spells out; BPE models are exact.
* ``HuggingFaceTokenizer``: its ``tokenizer.json``, minus a post-processor that adds special
  tokens (training tokenized with ``add_special_tokens=False``).
* ``GPT2BPETokenizer``: the byte-level BPE training built from ``--vocab-file`` and
  ``--merge-file``, with ``split_special_tokens`` (like Megatron-LM's, it does not read
  ``<|endoftext|>`` out of the text).

The end-of-document token (EOD) becomes ``eos_token``. Training added no BOS, and the export
says so where every reader looks (:func:`write_tokenizer`): ``add_bos_token`` and
``add_eos_token`` false in ``tokenizer_config.json`` (llama.cpp's converter copies them into
the GGUF; without them llama.cpp prepends a BOS the model never saw). The special tokens are
named all the same, since engines need them named (CTranslate2 refuses a Llama whose
``bos_token`` is null): BOS, UNK and PAD are the tokenizer's own pieces where it has them, else
EOD (GPT-2's convention, :func:`special_tokens`); their ids are the ones ``config.json`` and
``generation_config.json`` carry. ``tokenizer_class`` is ``PreTrainedTokenizerFast``, a class
transformers 4 and 5 both load from ``tokenizer.json`` (transformers 5 writes its own
``TokenizersBackend``, unknown to transformers 4). A sentencepiece tokenizer's ``.model``
travels as ``tokenizer.model``: llama.cpp's converter reads the pieces and their scores from
it (from ``tokenizer.json`` alone it scores every piece -1000, and encodes other ids).
A byte-level BPE (``HuggingFaceTokenizer``, ``GPT2BPETokenizer``) is known to llama.cpp's
converter only by the ids its vocabulary gives one fixed text (``chkhsh``): one trained for a
run is not in its list, and it refuses the folder ("BPE pre-tokenizer was not recognized");
:func:`llama_cpp_note` says so, naming the pre-tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import NamedTuple, Optional

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import SentencePieceExtractor, SpmConverter

from ..datasets.tokenizer import GPT2BPETokenizer, NullTokenizer, SentencePieceTokenizer
from ..runtime.errors import ConversionError
from ..runtime.files import read_json, write_text

SPM_UNIGRAM, SPM_BPE = 1, 2  # sentencepiece ModelProto.TrainerSpec.model_type


def _from_sentencepiece(model_file: str) -> Tokenizer:
    proto = SentencePieceExtractor(model_file).proto
    model_type = proto.trainer_spec.model_type
    if model_type not in (SPM_UNIGRAM, SPM_BPE):
        raise ConversionError(f"sentencepiece model {model_file} is of type {model_type}; "
                              f"only unigram and BPE models convert to Hugging Face")
    pieces = [(p.piece, p.score) for p in proto.pieces]
    vocab = pieces if model_type == SPM_UNIGRAM else {p: i for i, (p, _) in enumerate(pieces)}
    return SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)


def _from_tokenizer_json(file: str) -> Tokenizer:
    backend = Tokenizer.from_file(file)
    probe = "a b"
    if backend.encode(probe).ids != backend.encode(probe, add_special_tokens=False).ids:
        backend.post_processor = None
    return backend


class SpecialTokens(NamedTuple):
    """The special tokens an export names, as pieces; BOS and PAD are never added to a text
    (``add_bos_token`` false), UNK may be None (a byte-level BPE has none)."""
    bos: str
    eos: str
    unk: Optional[str]
    pad: str


def special_tokens(tokenizer, backend: Tokenizer) -> SpecialTokens:
    """The training ``tokenizer``'s special tokens as its export names them: the tokenizer's
    own BOS, UNK and PAD where it has them, else EOD for BOS and PAD."""
    eos = backend.id_to_token(tokenizer.eod)
    if isinstance(tokenizer, SentencePieceTokenizer):
        sp = tokenizer.sp
        own = {name: sp.id_to_piece(i) for name, i in
               (("bos", sp.bos_id()), ("unk", sp.unk_id()), ("pad", sp.pad_id())) if i >= 0}
    elif isinstance(tokenizer, GPT2BPETokenizer):
        own = {"unk": eos}  # GPT-2's: <|endoftext|> is BOS, EOS and UNK
    else:
        own = {name: tokenizer.named[f"{name}_token"] for name in ("bos", "unk", "pad")
               if f"{name}_token" in tokenizer.named}
    return SpecialTokens(bos=own.get("bos", eos), eos=eos, unk=own.get("unk"),
                         pad=own.get("pad", eos))


def hf_tokenizer(tokenizer, model_max_length: int) -> Optional[PreTrainedTokenizerFast]:
    """The HF tokenizer equal to a training tokenizer (None for ``NullTokenizer``), its
    special tokens named (:func:`special_tokens`)."""
    if isinstance(tokenizer, NullTokenizer):
        warnings.warn("NullTokenizer checkpoint: no tokenizer files are written; the exported "
                      "model takes token ids (AutoTokenizer cannot load it)", stacklevel=2)
        return None
    if isinstance(tokenizer, SentencePieceTokenizer):
        # sentencepiece never reads its control pieces (</s>, ...) out of the text
        backend = _from_sentencepiece(tokenizer.model_file)
        extra = dict(split_special_tokens=True)
    elif isinstance(tokenizer, GPT2BPETokenizer):
        backend = Tokenizer.from_str(tokenizer.tok.to_str())
        extra = dict(split_special_tokens=True)
    else:
        backend, extra = _from_tokenizer_json(tokenizer.model_file), {}
        backend.add_special_tokens(tokenizer.special_tokens)  # as training's tokenizer has
    named = special_tokens(tokenizer, backend)
    unk = {} if named.unk is None else {"unk_token": named.unk}
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=named.bos,
                                   eos_token=named.eos, pad_token=named.pad,
                                   model_max_length=model_max_length, **unk, **extra)


# The class a tokenizer_config.json names: one transformers 4 and 5 both have.
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
SENTENCEPIECE_FILE = "tokenizer.model"


def write_tokenizer(hf_tok: PreTrainedTokenizerFast, tokenizer, output: str) -> None:
    """Write ``hf_tok`` (:func:`hf_tokenizer` of the training ``tokenizer``) into ``output``,
    as every reader needs it: adding no BOS or EOS, its class one transformers 4 loads, a
    sentencepiece model beside it as ``tokenizer.model``."""
    hf_tok.save_pretrained(output)
    path = os.path.join(output, "tokenizer_config.json")
    config = read_json(path)
    config.update(tokenizer_class=TOKENIZER_CLASS, add_bos_token=False, add_eos_token=False)
    write_text(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    if isinstance(tokenizer, SentencePieceTokenizer):
        shutil.copyfile(tokenizer.model_file, os.path.join(output, SENTENCEPIECE_FILE))


def _pre_tokenizer(spec: Optional[dict]) -> str:
    if not spec:
        return "none"
    if spec.get("type") == "Sequence":
        return " + ".join(_pre_tokenizer(p) for p in spec.get("pretokenizers", []))
    if spec.get("type") == "Split":
        pattern = spec.get("pattern", {})
        return f"Split({pattern.get('Regex', pattern.get('String', '?'))!r})"
    return str(spec.get("type"))


def llama_cpp_note(hf_tok: Optional[PreTrainedTokenizerFast], tokenizer) -> Optional[str]:
    """What to tell the user of a byte-level BPE export before they try llama.cpp: its
    converter refuses a vocabulary it has not listed, and which pre-tokenizer this one has
    (None for a sentencepiece tokenizer or none)."""
    if hf_tok is None or isinstance(tokenizer, SentencePieceTokenizer):
        return None
    spec = json.loads(hf_tok.backend_tokenizer.to_str())
    if spec["model"].get("type") != "BPE":
        return None
    return ("llama.cpp: its convert_hf_to_gguf.py takes a byte-level BPE only when its list "
            "knows the vocabulary (by the ids it gives one text, chkhsh): one trained for a run "
            f"(pre-tokenizer {_pre_tokenizer(spec.get('pre_tokenizer'))} here) is not in it, "
            "and the converter refuses the folder with 'BPE pre-tokenizer was not recognized' "
            "(docs/hf-export.md)")
