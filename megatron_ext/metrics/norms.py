"""Parameter and gradient norms for diagnostics, computed here and logged by the training loop
(:mod:`megatron_ext.train.loop`, ``--log-params-norm`` and ``--log-layer-norms``).

``params_norm`` is Megatron-LM's ``--log-params-norm``: the L2 norm of every trainable
parameter of the whole model. ``param_norms`` and ``grad_norms`` are the L2 norms of a few
watched groups (:func:`watched_groups`): the input table, the first, middle and last
transformer layer and the output head, the signal that tells how the first layers of a
fixed-code arm adapt compared with the learned arm.

Every rank of a model-parallel group calls them together (one all_reduce over tensor and
pipeline ranks) and gets the same values. A parameter duplicated on every tensor-parallel
rank counts once, and so does a tied input table: under pipeline parallelism its copy on the
last stage is skipped, and at any pipeline size it is reported as ``input-table``, with no
``output-layer`` group.
"""

from __future__ import annotations

import math

import torch

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from .logger import parameters_counted_once

INPUT_TABLE = "input-table"
OUTPUT_LAYER = "output-layer"
def parameter_group(name: str):
    """The watched group of a parameter outside the layers, by name, or None: every input
    parameter (the learned or frozen table, a factorised table's two factors, a code's map)
    is the input's."""
    if name.startswith("embedding."):
        return INPUT_TABLE
    return OUTPUT_LAYER if name == "output_layer.weight" else None


def layer_group(layer_number: int) -> str:
    """The group of the transformer layer with this global, 1-based ``layer_number``."""
    return f"layer-{layer_number:02d}"


def watched_groups(num_layers: int) -> list[str]:
    """The groups every rank reports, in order: input table, first, middle and last layer,
    output head."""
    layer_numbers = dict.fromkeys((1, (num_layers + 1) // 2, num_layers))
    return [INPUT_TABLE, *map(layer_group, layer_numbers), OUTPUT_LAYER]


def gradient(param: torch.nn.Parameter):
    """Megatron DDP's reduced gradient (``main_grad``) when the parameter has one, else
    ``.grad``."""
    return param.main_grad if hasattr(param, "main_grad") else param.grad


class NormReporter:
    """Norms of the whole model, from the bare GPTModel of this rank's pipeline stage (not the
    DDP wrapper). Build it once; call the methods on every rank of the model-parallel group."""

    def __init__(self, model: GPTModel):
        self.groups = watched_groups(model.config.num_layers)
        group_of = {}  # id(parameter) -> index in self.groups
        for layer in model.decoder.layers:  # layer_number is global under pipelining
            group = layer_group(layer.layer_number)
            if group in self.groups:
                group_of.update((id(p), self.groups.index(group)) for p in layer.parameters())
        for name, p in model.named_parameters():
            if parameter_group(name) is not None:
                group_of[id(p)] = self.groups.index(parameter_group(name))
        self.params = [p for _, p in parameters_counted_once(model)]
        self.device = self.params[0].device
        watched = [(i, group_of[id(p)]) for i, p in enumerate(self.params) if id(p) in group_of]
        self.watched_positions = torch.tensor([i for i, _ in watched], dtype=torch.long,
                                              device=self.device)
        self.watched_group_index = torch.tensor([g for _, g in watched], dtype=torch.long,
                                                device=self.device)
        self.params_per_group = torch.bincount(self.watched_group_index,
                                               minlength=len(self.groups)).float()

    def _norms(self, tensors: list) -> tuple[float, dict[str, float]]:
        """``(L2 norm of all tensors, {group: L2 norm})`` over the model-parallel group, for
        ``tensors`` aligned with ``self.params`` (``None`` counts as zeros); a group with no
        parameter on any rank is absent."""
        zero = torch.zeros((), device=self.device)
        squares = torch.stack([zero if t is None else torch.linalg.vector_norm(
            t, dtype=torch.float32) for t in tensors]).square()
        per_group = torch.zeros(len(self.groups), device=self.device).index_add_(
            0, self.watched_group_index, squares[self.watched_positions])
        reduced = torch.cat([squares.sum().view(1), per_group, self.params_per_group])
        torch.distributed.all_reduce(reduced, group=parallel_state.get_model_parallel_group())
        total, *rest = reduced.tolist()
        sums, counts = rest[:len(self.groups)], rest[len(self.groups):]
        return math.sqrt(total), {group: math.sqrt(s) for group, s, count
                                  in zip(self.groups, sums, counts) if count}

    def params_norm(self) -> float:
        """L2 norm of all trainable parameters of the whole model."""
        return self._norms(self.params)[0]

    def param_norms(self) -> dict[str, float]:
        """``{group: L2 norm of its parameters}``."""
        return self._norms(self.params)[1]

    def grad_norms(self, loss_scale: float = 1.0) -> dict[str, float]:
        """``{group: L2 norm of its gradients}``, read after the backward pass (and the
        data-parallel reduction) and before the optimizer step: unclipped. Under ``--fp16``
        pass the optimizer's loss scale, by which those gradients are still multiplied."""
        return {group: norm / loss_scale
                for group, norm in self._norms([gradient(p) for p in self.params])[1].items()}
