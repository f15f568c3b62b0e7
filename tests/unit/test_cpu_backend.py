"""The CPU backend lets Megatron-Core's optimizer clip gradients on CPU tensors."""

from __future__ import annotations

import torch

from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from helpers.small_model import SMALL_VOCAB, small_args
from megatron_ext.model.provider import model_provider


def test_gradient_clipping_bounds_the_update(cpu_dist):
    """With SGD (lr 1, no momentum, no decay) the update equals the clipped gradient, so its
    norm must equal --clip-grad when the raw gradient norm is larger."""
    torch.manual_seed(0)
    model = model_provider(small_args("binary"), SMALL_VOCAB, on_cpu=True)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    max_norm = 1e-3
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="sgd", lr=1.0, sgd_momentum=0.0,
                                                 weight_decay=0.0, clip_grad=max_norm), [ddp])
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(0, 500, (2, 16))
    ddp(ids, torch.arange(16).expand(2, 16), None, labels=ids).mean().backward()
    ddp.finish_grad_sync()
    updated, grad_norm, _ = opt.step()
    assert updated and grad_norm > 100 * max_norm
    update = torch.sqrt(sum(((p.detach() - b) ** 2).sum()
                            for p, b in zip(model.parameters(), before)))
    assert abs(update.item() - max_norm) / max_norm < 1e-3
