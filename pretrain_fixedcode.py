"""Pretrain a GPT model whose input is a learned table or a fixed code of the token id.

The entry point of the project, shaped like Megatron-LM's pretrain_gpt.py: a model provider,
a forward step and a datasets provider, handed to the training loop. One process for CPU
runs; ``torchrun`` (or ``srun`` with one task per GPU) for several::

    python pretrain_fixedcode.py --input-interface binary --num-layers 2 --hidden-size 64 \\
        --num-attention-heads 4 --seq-length 64 --micro-batch-size 4 --train-iters 20 \\
        --mock-data --tokenizer-type NullTokenizer --vocab-size 1024

The arm is ``--input-interface``: ``learned`` (Megatron's embedding table, the control),
``binary``, ``gf2``, ``permuted`` or ``random`` (a fixed, parameter-free code of the token
id, tiled to the model width; see docs/codes.md). The only place the arms differ is the end
of :func:`megatron_ext.model.provider.model_provider`, which replaces GPTModel's embedding with a
:class:`megatron_ext.codes.embedding.FixedCodeEmbedding` for a fixed-code arm; the backbone and the
head are built identically (for one ``--seed``, the same initial weights in every arm).

See ``--help`` for every flag; they keep Megatron-LM's names.
"""

from __future__ import annotations

import sys

# Before anything else: with --exit-signal-handler, a SIGTERM/SIGUSR1 that arrives while the
# job is still starting (importing torch takes seconds) must not kill it. exit_signals
# imports nothing heavy; its package sets the warning filters megatron.core needs first.
from megatron_ext.runtime import exit_signals
exit_signals.install_if_requested(sys.argv[1:])

from functools import partial  # noqa: E402

import torch  # noqa: E402
from megatron.core import parallel_state  # noqa: E402

from megatron_ext.model import provider as fixedcode_model
from megatron_ext.config.arguments import parse_run_config
from megatron_ext.config.run_config import RunConfig
from megatron_ext.datasets.gpt_datasets import build_train_valid_test
from megatron_ext.runtime.errors import exits_on_error
from megatron_ext.runtime.initialize import destroy_distributed
from megatron_ext.checkpoint.saved_args import with_checkpoint_args
from megatron_ext.train.step import NonFiniteLossError
from megatron_ext.train.loop import PretrainResult, pretrain
from megatron_ext.train.run_status import record_run_end


def model_provider(config: RunConfig, padded_vocab_size, pre_process=True, post_process=True,
                   code=None):
    """GPTModel for this pipeline stage, with the arm's input interface (the swap of the
    input table for the fixed code is in megatron_ext/model/provider.py:model_provider). The loop
    passes what it settled once: the run's config, the padded vocabulary, and the run's fixed
    code (the checkpoint's, or drawn from the flags)."""
    return fixedcode_model.model_provider(config, padded_vocab_size, pre_process, post_process,
                                          on_cpu=config.training.device == "cpu", code=code)


def get_batch(data_iterator, device: torch.device):
    """The micro-batch this pipeline stage needs (middle stages need none), on ``device``:
    tokens, labels, loss mask, position ids, and the attention mask (``--reset-attention-mask``;
    else None: causal)."""
    if not (parallel_state.is_pipeline_first_stage() or parallel_state.is_pipeline_last_stage()):
        return None, None, None, None, None
    batch = next(data_iterator)
    move = (lambda t: t.to(device, non_blocking=True)) if device.type == "cuda" else (lambda t: t)
    mask = batch.get("attention_mask")
    return (move(batch["tokens"]), move(batch["labels"]), move(batch["loss_mask"]),
            move(batch["position_ids"]), None if mask is None else move(mask))


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Mean token loss over unmasked tokens; reports this rank's ``[sum, count]`` (the loop
    sums them over micro-batches and data-parallel ranks once per step)."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss_sum = torch.sum(losses * mask)
    count = mask.sum()
    return loss_sum / count, {"lm loss": torch.stack([loss_sum.detach(), count])}


def forward_step(data_iterator, model):
    """One micro-batch through ``model``; the batch goes to the device the model is on."""
    tokens, labels, loss_mask, position_ids, attention_mask = get_batch(
        data_iterator, next(model.parameters()).device)
    output = model(tokens, position_ids, attention_mask, labels=labels)
    return output, partial(loss_func, loss_mask)


def datasets_provider(config: RunConfig, tokenizer, num_samples, consumed_train_samples):
    """Train iterator, validation and test datasets (Megatron GPT datasets, or mock data; the
    test one None where not evaluated); ``num_samples``: the sequences drawn from the train,
    valid and test split."""
    return build_train_valid_test(config, tokenizer, num_samples, consumed_train_samples)


def parse_args(argv=None) -> RunConfig:
    """The flags as the run's config (with ``--use-checkpoint-args``, the checkpoint's model
    flags), refused before anything starts where they alone do not go together
    (:meth:`megatron_ext.config.run_config.RunConfig.validate`)."""
    return parse_run_config(argv, __doc__.splitlines()[0], fill=with_checkpoint_args)


def main(argv=None) -> PretrainResult:
    """Train; the process group is destroyed when every rank ends the same way (done, or
    the agreed non-finite stop): left to the interpreter's exit, NCCL warns, and its warning
    became the last log line of a failed GPU run, hiding the error. After any other error
    the ranks may be mid-collective, and it is left alone. An error ends the command with
    its type's exit status (``exits_on_error``): 3 for the non-finite stop, 4 for a failed
    save, which slurm/fixedcode.sbatch reads."""
    with exits_on_error():
        config = parse_args(argv)
        try:
            result = pretrain(config, model_provider, forward_step, datasets_provider)
        except NonFiniteLossError:
            destroy_distributed()
            raise
        finally:
            if config.checkpoint.exit_signal_handler:
                exit_signals.ignore()  # a signal after this point has nothing left to stop
        record_run_end(result.iteration, result.exit_reason)  # done, or stopped early
        destroy_distributed()
        return result


if __name__ == "__main__":
    main()
