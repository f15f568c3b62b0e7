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

The end-of-document token (EOD) becomes ``eos_token``; there is no BOS (training used none).
"""

from __future__ import annotations

import warnings
from typing import Optional

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import SentencePieceExtractor, SpmConverter

from ..datasets.tokenizer import GPT2BPETokenizer, NullTokenizer, SentencePieceTokenizer
from ..runtime.errors import ConversionError

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


def hf_tokenizer(tokenizer, model_max_length: int) -> Optional[PreTrainedTokenizerFast]:
    """The HF tokenizer equal to a training tokenizer (None for ``NullTokenizer``)."""
    if isinstance(tokenizer, NullTokenizer):
        warnings.warn("NullTokenizer checkpoint: no tokenizer files are written; the exported "
                      "model takes token ids (AutoTokenizer cannot load it)", stacklevel=2)
        return None
    if isinstance(tokenizer, SentencePieceTokenizer):
        # sentencepiece never reads its control pieces (</s>, ...) out of the text
        backend = _from_sentencepiece(tokenizer.model_file)
        extra = dict(unk_token=tokenizer.sp.id_to_piece(tokenizer.sp.unk_id()),
                     split_special_tokens=True)
    elif isinstance(tokenizer, GPT2BPETokenizer):
        backend = Tokenizer.from_str(tokenizer.tok.to_str())
        extra = dict(split_special_tokens=True)
    else:
        backend, extra = _from_tokenizer_json(tokenizer.model_file), {}
        backend.add_special_tokens(tokenizer.special_tokens)  # as training's tokenizer has
    return PreTrainedTokenizerFast(tokenizer_object=backend,
                                   eos_token=backend.id_to_token(tokenizer.eod),
                                   model_max_length=model_max_length, **extra)
