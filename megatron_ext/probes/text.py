"""The held-out text a probe run reads (tools/probe.py): the first tokens of an indexed
dataset (as a study's held-out set), or of a JSONL file encoded with a tokenizer, each
document followed by the end-of-document token; cut into windows, with each token's
document, by the core's megatron_ext/datasets/held_out.py.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..datasets.held_out import cut_documents, indexed_documents


def jsonl_documents(path: str, key: str, tokenizer):
    """Token arrays of the JSONL documents, each ending with the end-of-document token."""
    from ..preprocess.readers import iter_texts
    for texts in iter_texts([path], "line", [key], "--jsonl"):
        ids = [i for text in texts[key] for i in tokenizer.tokenize(text)] + [tokenizer.eod]
        yield np.asarray(ids, dtype=np.int64)


def held_out(tokens: int, seq_length: int, data_path: Optional[str] = None,
             jsonl: Optional[str] = None, json_key: str = "text", tokenizer=None,
             tokenizer_name: str = "") -> tuple[np.ndarray, np.ndarray, str]:
    """The windows of the first ``tokens`` tokens of ``data_path`` (an indexed dataset) or
    of ``jsonl`` (encoded by ``tokenizer``, a megatron_ext.datasets.tokenizer one named
    ``tokenizer_name``), each token's document, and a description of where they come from."""
    if data_path:
        return (*cut_documents(indexed_documents(data_path), tokens, seq_length,
                               f"--data-path {data_path}", "--tokens"),
                f"the first {tokens:,} tokens of {data_path}")
    documents = jsonl_documents(jsonl, json_key, tokenizer)
    return (*cut_documents(documents, tokens, seq_length, f"--jsonl {jsonl}", "--tokens"),
            f"the first {tokens:,} tokens of {jsonl} ({tokenizer_name})")
