"""The models a probe run reads, as Hugging Face causal LMs in fp32.

A model is a Hugging Face export (a folder with ``config.json``, tools/convert_to_hf.py's
output) or a training checkpoint (a ``--save`` folder), which is **converted on the fly**:
read into one CPU GPTModel (:mod:`megatron_ext.hf.megatron_checkpoint`, any TP/PP) and
mapped to the same Llama as the export (:mod:`megatron_ext.hf.convert`, whose logits match
Megatron's to 1e-4). One code path then reads every model: the residual stream is the
output of each ``model.model.layers[i]`` (and of ``embed_tokens``, the input to layer 0),
and the logit lens applies ``model.model.norm`` and ``lm_head``. Reading Megatron's layers
directly would need a second path ([s, b, h] layout, its own norm and head calls) for no
gain; the conversion holds the model twice only while it is built.

:func:`describe` reads what is cheap (shape, arm, vocabulary, tokenizer) so that models can
be checked against each other before any weights load; ``ModelInfo.load()`` loads them.
Two models are comparable (the same token ids mean the same text to both) when their
vocabularies have the same size and their tokenizers encode the same probe texts to the
same ids (:data:`megatron_ext.hf.parity.PROBE_TEXTS`, the export's own tokenizer check).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Optional

import torch

from ..hf.parity import PROBE_TEXTS
from ..runtime.errors import CheckpointError, DataError, FlagError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclasses.dataclass
class ModelInfo:
    name: str
    source: str        # the folder (and iteration)
    arm: str           # a checkpoint's --input-interface; an export's: learned or the scheme
    code: Optional[dict]  # {"scheme", "tiling", "num_bits"} of a fixed code; None: learned
    num_layers: int
    hidden_size: int
    intermediate: int  # the MLP's width
    heads: int         # attention heads
    vocab_size: int    # ids the model reads and predicts (the padded vocabulary)
    context: int       # the training sequence length, else max_position_embeddings
    tokenizer: Optional[dict]  # {"name", "probe_ids"}; None: the model reads ids only
    seed: Optional[int]  # the training --seed (checkpoints): draws the random initialisation
    trained_on: tuple[str, ...]  # the dataset prefixes it trained on (checkpoints), else ()
    load: Callable[[], torch.nn.Module] = dataclasses.field(repr=False, compare=False)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "load"}


def describe(path: str, name: Optional[str] = None, iteration: Optional[int] = None
             ) -> ModelInfo:
    """The model at ``path``: a Hugging Face export or a training checkpoint (``iteration``,
    default its latest). ``name`` defaults to the folder's name."""
    name = name or Path(path).resolve().name
    if os.path.isfile(os.path.join(path, "config.json")):
        if iteration is not None:
            raise FlagError(f"{path} is a Hugging Face export; an iteration applies "
                            f"to training checkpoints only")
        return _describe_export(path, name)
    if not os.path.isdir(path):
        raise CheckpointError(f"model {path}: no such folder (a Hugging Face export or a "
                              f"training checkpoint's --save folder)")
    return _describe_checkpoint(path, name, iteration)


def _describe_export(path: str, name: str) -> ModelInfo:
    from transformers import AutoConfig

    from ..hf.parity import load_hf, load_tokenizer
    config = AutoConfig.from_pretrained(path, trust_remote_code=True)
    code = getattr(config, "fixed_code", None)
    tokenizer = None
    if any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        hf = load_tokenizer(path)
        tokenizer = {"name": f"the tokenizer of {path}",
                     "probe_ids": [hf(text)["input_ids"] for text in PROBE_TEXTS]}
    return ModelInfo(name=name, source=path, arm=code["scheme"] if code else "learned",
                     code=_code_summary(code),
                     num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
                     intermediate=config.intermediate_size, heads=config.num_attention_heads,
                     vocab_size=config.vocab_size, context=config.max_position_embeddings,
                     tokenizer=tokenizer, seed=None, trained_on=(),
                     load=lambda: load_hf(path))


def _describe_checkpoint(path: str, name: str, iteration: Optional[int]) -> ModelInfo:
    from ..hf.convert import check_mappable
    from ..datasets.tokenizer import NullTokenizer, check_training_tokenizer, tokenizer_from_args
    from ..hf.megatron_checkpoint import read_checkpoint
    ckpt, trained, fixed_code, saved = read_checkpoint(path, iteration)
    model, data = trained.config.model, trained.config.data
    check_mappable(model, fixed_code, ckpt)
    try:
        tokenizer = tokenizer_from_args(data)
        check_training_tokenizer(tokenizer, trained.tokenizer_sha256, ckpt)
    except DataError as e:
        raise DataError(f"{ckpt}: its tokenizer: {e}; export it with tools/convert_to_hf.py "
                        f"--tokenizer-model and probe the export") from e
    described = None
    if not isinstance(tokenizer, NullTokenizer):
        files = getattr(tokenizer, "model_file", None) or data.vocab_file
        described = {"name": f"{data.tokenizer_type} {files}",
                     "probe_ids": [tokenizer.tokenize(text) for text in PROBE_TEXTS]}

    def load() -> torch.nn.Module:
        from ..hf.convert import build_hf_model, hf_config, hf_state_dict
        from ..hf.megatron_checkpoint import load_model
        from ..runtime.initialize import initialize_distributed
        initialize_distributed("cpu")
        state = load_model(ckpt, trained, fixed_code).state_dict()
        vocab = trained.padded_vocab_size
        return build_hf_model(hf_config(model, vocab, fixed_code, torch.float32,
                                        dict(eos_token_id=tokenizer.eod)),
                              hf_state_dict(state, model, vocab, torch.float32), device="cpu")

    return ModelInfo(name=name, source=f"{path} iteration {saved}", arm=model.input_interface,
                     code=_code_summary(fixed_code),
                     num_layers=model.num_layers, hidden_size=model.hidden_size,
                     intermediate=model.ffn_hidden_size, heads=model.num_attention_heads,
                     vocab_size=trained.padded_vocab_size, context=model.seq_length,
                     tokenizer=described, seed=trained.config.training.seed,
                     trained_on=tuple(_trained_on(data)), load=load)


def _trained_on(data) -> list[str]:
    """The training run's dataset prefixes (its ``data`` config's --data-path and
    --train-data-path, a blend file's read into them by :func:`read_checkpoint`)."""
    from ..config.recipes import TRAINING_DATA_FLAGS, training_prefixes
    from ..hf.megatron_checkpoint import BLEND_FILE_ARGS
    for name in BLEND_FILE_ARGS:
        if getattr(data, name):
            raise DataError(f"the training blend file --{name.replace('_', '-')} "
                            f"{getattr(data, name)} is not readable here: the held-out text "
                            f"cannot be checked against the prefixes it names")
    flags = []
    for flag in TRAINING_DATA_FLAGS:
        value = getattr(data, flag[2:].replace("-", "_"))
        if value:
            flags += [flag, *map(str, value)]
    return training_prefixes(flags)


def _code_summary(code: Optional[dict]) -> Optional[dict]:
    return None if not code else {"scheme": code["scheme"],
                                  "tiling": code.get("tiling", "repeat"),
                                  "num_bits": int(code["num_bits"])}


TABLE_NOTES = {"learned": "the input table: a learned lookup of the id",
               "frozen": "the input table: a random lookup of the id, never trained",
               "factorized": "the input table: a learned lookup of the id, of low rank"}


def input_note(code: Optional[dict], arm: str = "learned") -> str:
    """What layer 0 (the input to the first layer) is, for the table's † note (``arm``: a
    checkpoint's --input-interface; an export's table arms all read ``learned``)."""
    if code is None:
        return TABLE_NOTES.get(arm, TABLE_NOTES["learned"])
    recoded = code["tiling"] == "recode"
    if code["scheme"] == "binary" and not recoded:
        return "the code: the id's bits repeated, exactly linear in them (trivially decodable)"
    if code["scheme"] in ("binary", "gf2"):
        return ("the code: GF(2)-affine maps of the id's bits (" + code["scheme"] + ", "
                + code["tiling"] + " tiling): a lookup decodes them, a linear probe over the "
                "reals need not")
    what = {"permuted": "the bits of a permuted id", "random": "the bits of a random "
            "integer drawn per id"}[code["scheme"]]
    return (f"the code: {what} (a fixed table, {code['tiling']} tiling): no structure of "
            f"the id's own bits")


def id_bits_carried(code: Optional[dict]) -> bool:
    """Whether the input holds the id's bits linearly (binary, repeat tiling): the residual
    stream then carries them up every layer, trained or not."""
    return code is not None and code["scheme"] == "binary" and code["tiling"] == "repeat"


def difference(a: ModelInfo, b: ModelInfo) -> Optional[str]:
    """Why the same token ids do not mean the same text to ``a`` and ``b``, or None."""
    if a.vocab_size != b.vocab_size:
        return (f"vocabulary: {a.name} has {a.vocab_size:,} ids, {b.name} "
                f"{b.vocab_size:,}")
    if (a.tokenizer is None) != (b.tokenizer is None):
        with_ids_only = a if a.tokenizer is None else b
        other = b if a.tokenizer is None else a
        return (f"tokenizer: {with_ids_only.name} has none (it reads token ids), {other.name} "
                f"has {other.tokenizer['name']}")
    if a.tokenizer is not None:
        for text, x, y in zip(PROBE_TEXTS, a.tokenizer["probe_ids"],
                              b.tokenizer["probe_ids"]):
            if x != y:
                return (f"tokenizer: {a.name} ({a.tokenizer['name']}) encodes {text!r} as "
                        f"{x[:8]}..., {b.name} ({b.tokenizer['name']}) as {y[:8]}...")
    return None


def check_text_tokenizer(models: list[ModelInfo], tokenizer, name: str) -> None:
    """Refuse a tokenizer (``name``, a megatron_ext.datasets.tokenizer one) for the held-out
    text (``--jsonl``) whose ids would mean other text to a model than to it: one that encodes
    the probe texts otherwise than a model's own tokenizer, or, for a model that reads ids
    only, one with ids beyond its vocabulary."""
    for info in models:
        if info.tokenizer is None:
            if tokenizer.vocab_size > info.vocab_size:
                raise DataError(f"--jsonl: {name} has {tokenizer.vocab_size:,} ids, model "
                                f"{info.name} reads {info.vocab_size:,}")
            continue
        for text, ours in zip(PROBE_TEXTS, info.tokenizer["probe_ids"]):
            ids = tokenizer.tokenize(text)
            if ids != ours:
                raise DataError(f"--jsonl: {name} encodes {text!r} as {ids[:8]}..., model "
                                f"{info.name}'s tokenizer ({info.tokenizer['name']}) as "
                                f"{ours[:8]}...: encode the text with the models' own")


def check_held_out(models: list[ModelInfo], data_path: str, allow: bool) -> None:
    """Refuse held-out text (``--data-path``) that a model's training run read (its
    prefixes as :func:`read_checkpoint` gives them; the relative ones of a checkpoint too
    old to record its run's folder taken from the repository root, where the launchers
    start runs)."""
    from ..config.recipes import check_held_out as check
    from ..launch.slurm import REPO
    for info in models:
        check(data_path, info.trained_on, REPO, "--data-path",
              f"model {info.name}'s training run", allow, "--allow-train-text")


def random_twin(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A randomly initialised model of the same arm and shape (the same config, the same
    fixed code), drawn from ``seed`` by Hugging Face's initialisation: normal weights of std
    ``initializer_range`` (the training ``--init-method-std``), unit norms. Megatron's own
    initialisation differs only in scaling the two output projections of each layer by
    1/sqrt(2·layers)."""
    torch.manual_seed(seed)
    return type(model)(model.config).eval()
