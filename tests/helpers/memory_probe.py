"""What a training step really holds, measured for tests/integration/test_memory_plan.py
against megatron_ext/model/memory.py: the bytes of the weights, gradients and optimizer state
of a built model and optimizer (their tensors, after one step), and the peak of the tensors a
forward and backward pass allocates (every storage an operator creates, alive until freed:
what ``torch.cuda.max_memory_allocated`` measures on a GPU, here on CPU). Runs in the test's
process (one rank) or in tests/helpers/memory_worker.py under torchrun."""

from __future__ import annotations

import os
import weakref

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from megatron_ext.model.memory import footprint
from megatron_ext.train.setup import build_model_and_optimizer, check_machine_and_tokenizer
from megatron_ext.train.step import train_step
from pretrain_fixedcode import forward_step, model_provider, parse_args

# A small shape: activations large against everything else a step allocates.
SHAPE = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "256", "--micro-batch-size", "4", "--mock-data",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "1023", "--device", "cpu",
         "--eval-iters", "0", "--train-iters", "4", "--lr", "1e-3"]


class PeakTensorMemory(TorchDispatchMode):
    """Within it, the bytes of the tensor storages operators allocate and that are still
    alive (``live``), and their largest sum (``peak``). An operator's output that shares an
    input's storage (a view, an in-place update: of a parameter, a gradient buffer) is not
    an allocation."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.refs = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if id(storage) in self.refs or storage.data_ptr() in inputs:
                    continue
                size = storage.nbytes()
                self.live += size
                self.peak = max(self.peak, self.live)
                self.refs[id(storage)] = weakref.ref(storage, self._freed(id(storage), size))
        return out

    def _freed(self, key: int, size: int):
        def freed(_):
            self.live -= size
            self.refs.pop(key, None)
        return freed


def batches(run, seed: int = 0):
    """Random micro-batches of the run's shape, as the datasets give them."""
    gen = torch.Generator().manual_seed(seed)
    b, s = run.training.micro_batch_size, run.model.seq_length
    while True:
        tokens = torch.randint(0, run.data.vocab_size, (b, s + 1), generator=gen)
        yield {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(),
               "loss_mask": torch.ones(b, s), "position_ids": torch.arange(s).repeat(b, 1)}


def state_tensor_bytes(model, optimizer) -> dict:
    """``{"weights", "gradients", "optimizer"}``: the bytes of this rank's parameters, of
    their gradient buffers (``main_grad``), and of the optimizer's own tensors: Adam's state
    and the master copies that share no storage with the model's parameters."""
    params = list(model.parameters())
    shared = {p.untyped_storage().data_ptr() for p in params}
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    inner = [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    own = [p for o in inner for group in o.param_groups for p in group["params"]
           if p.untyped_storage().data_ptr() not in shared]
    state = [t for o in inner for s in o.state.values() for t in s.values()
             if isinstance(t, torch.Tensor) and t.dim() > 0]
    return {"weights": sum(nbytes(p) for p in params),
            "gradients": sum(nbytes(p.main_grad) for p in params if p.requires_grad),
            "optimizer": sum(map(nbytes, own)) + sum(map(nbytes, state))}


def measure(argv: list) -> dict:
    """Build the run of ``argv`` (a process group up, of the run's layout), take one step,
    then measure a second step's forward and backward passes. ``{"state": real bytes,
    "peak": measured activation peak, "planned": the footprint of this rank's stage}``.
    The environment is restored after it (GPTModel pins the attention backend there)."""
    saved = dict(os.environ)
    try:
        return _measure(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _measure(argv: list) -> dict:
    _, run, derived = check_machine_and_tokenizer(parse_args(SHAPE + list(argv)), "cpu")
    model, ddp, optimizer, scheduler = build_model_and_optimizer(run, derived, model_provider)
    data = batches(run)
    train_step(run, derived.num_microbatches, forward_step, data, ddp, optimizer, scheduler)
    state = state_tensor_bytes(model, optimizer)
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    with PeakTensorMemory() as memory:
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=data, model=[ddp],
            num_microbatches=derived.num_microbatches, seq_length=run.model.seq_length,
            micro_batch_size=run.training.micro_batch_size, forward_only=False)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    planned = footprint(run, derived.padded_vocab_size, derived.data_parallel_size,
                        derived.num_microbatches, device="cpu", stage=stage)
    return {"state": state, "peak": memory.peak, "planned": planned}
