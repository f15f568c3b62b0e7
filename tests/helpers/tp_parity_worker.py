"""Worker for test_tp_parity.py: the same weights at TP=1 and TP=2 must give the same logits.

``save DIR``: one process (TP=1; the test's own) builds each arm, saves its weights with
dist_checkpointing and its logits for a fixed batch. ``check DIR``: run under torchrun with 2 processes (TP=2), loads
those weights (resharded by dist_checkpointing), gathers the vocab-parallel logits and writes
the largest difference per arm to ``DIR/tp2_diff.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import megatron_ext  # noqa: F401
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

from megatron_ext.config.arguments import parse_model_config
from megatron_ext.config.model_config import padded_vocab_size
from megatron_ext.runtime.initialize import initialize_distributed
from megatron_ext.model.provider import model_provider

# name -> input flags: every scheme; random also with the recode tiling and a truncated last
# block (13 bits at width 64); the frozen and factorised tables and a code's map.
ARMS = {
    "learned": ["--input-interface", "learned"],
    "binary": ["--input-interface", "binary"],
    "gf2": ["--input-interface", "gf2"],
    "permuted": ["--input-interface", "permuted"],
    "random_recode_13bit": ["--input-interface", "random", "--code-tiling", "recode",
                            "--code-bits", "13"],
    "frozen": ["--input-interface", "frozen"],
    "factorized_r8": ["--input-interface", "factorized", "--input-table-rank", "8"],
    "binary_map": ["--input-interface", "binary", "--code-projection"],
}
VOCAB = 500


def build(arm: str, tp: int):
    args = parse_model_config(["--num-layers", "2", "--hidden-size", "64",
                               "--num-attention-heads", "4", "--seq-length", "16",
                               "--vocab-size", str(VOCAB), *ARMS[arm],
                               "--tensor-model-parallel-size", str(tp)], "tp parity")[0]
    return model_provider(args, padded_vocab_size(VOCAB, 128, tp), on_cpu=True).eval()


def logits(model) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, torch.arange(16).expand(2, 16), None)
    return gather_from_tensor_model_parallel_region(out)[..., :VOCAB]


def main(mode: str, root: str) -> None:
    tp = 1 if mode == "save" else 2
    initialize_distributed("cpu", tp, 1, seed=1234)
    diffs = {}
    for arm in ARMS:
        model = build(arm, tp)
        path = os.path.join(root, arm)
        if mode == "save":
            os.makedirs(path, exist_ok=True)
            dist_checkpointing.save(model.sharded_state_dict(), path)
            torch.save(logits(model), path + ".logits.pt")
        else:
            model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), path))
            diffs[arm] = (logits(model) - torch.load(path + ".logits.pt")).abs().max().item()
    if mode == "check" and parallel_state.get_tensor_model_parallel_rank() == 0:
        with open(os.path.join(root, "tp2_diff.json"), "w") as f:
            json.dump(diffs, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
