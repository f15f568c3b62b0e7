"""The fixed token sample and the residual stream at every layer, on it.

Held-out windows (``[n, S + 1]`` ids) come with the document of every token
(:func:`megatron_ext.datasets.held_out.cut_documents`). From positions ``1 .. S-1`` of every
window a fixed random sample of token positions is drawn (each has a previous token in its
context and a next token to predict) among those whose context lies inside one document: a
position in a document that began after the window's start would see the end of another
document before it, so it is never drawn. The sample is split into the documents that train
the probes and those that score them by :class:`megatron_ext.probes.targets.Split` (once per
probe seed). The models then run over the windows that hold sampled positions, batch by
batch; hooks on the input (``embed_tokens``) and on every decoder layer copy the sampled
positions out of each layer's output as it is made and keep nothing else, so memory is
``sample x (layers + 1) x hidden`` floats plus one layer's activations of one batch
(:func:`memory_bound`), whatever the number of held-out tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..runtime.errors import DataError


@dataclasses.dataclass
class Sample:
    """Sampled positions ``(window, position)`` with their ids (numpy arrays)."""
    window: np.ndarray
    position: np.ndarray
    current: np.ndarray    # the token at the position
    previous: np.ndarray   # the token before it
    following: np.ndarray  # the token to predict
    document: np.ndarray   # the document the position is in
    early: np.ndarray      # bool: position < S/2 (the position-transfer control)
    seq_length: int

    def __len__(self) -> int:
        return len(self.window)


def draw_sample(windows: np.ndarray, documents: np.ndarray, count: int, seed: int) -> Sample:
    """``count`` positions (all of them when fewer) drawn with ``seed``, sorted, among those
    whose window holds no token of another document before them."""
    n, seq_length = windows.shape[0], windows.shape[1] - 1
    if documents.shape != windows.shape:
        raise ValueError(f"documents {documents.shape} must match windows {windows.shape}")
    if n < 1 or seq_length < 3:
        raise DataError(f"probes need windows of at least 3 tokens; the held-out set "
                        f"gives {n} of {seq_length}: raise --tokens")
    inside = documents[:, 1:seq_length] == documents[:, :1]   # positions 1 .. S-1
    candidates = np.flatnonzero(inside)
    rng = np.random.default_rng(seed)
    flat = np.sort(rng.choice(candidates, size=min(count, len(candidates)), replace=False))
    window, position = flat // (seq_length - 1), flat % (seq_length - 1) + 1
    document = documents[window, position]
    names = np.unique(document)
    if len(names) < 2:
        raise DataError(f"the held-out tokens hold {len(names)} document at positions whose "
                        f"window lies inside one document; the probes train on half of the "
                        f"documents and score on the other half: raise --tokens or use text "
                        f"of several documents")
    return Sample(window=window, position=position, current=windows[window, position],
                  previous=windows[window, position - 1],
                  following=windows[window, position + 1], document=document,
                  early=position < seq_length // 2, seq_length=seq_length)


def memory_bound(sample_size: int, layers: int, hidden: int, intermediate: int, heads: int,
                 batch_size: int, seq_length: int) -> int:
    """Bytes :func:`hidden_states` holds at most: the kept states (fp32) plus one decoder
    layer's activations for one batch (fp32: 8 of the width (its input and output, two
    norms, q/k/v and the attention output), 4 of the MLP's (gate, its activation, up and
    their product), and the attention scores and probabilities)."""
    kept = sample_size * (layers + 1) * hidden * 4
    tokens = batch_size * seq_length
    layer = tokens * (8 * hidden + 4 * intermediate) * 4 + 2 * batch_size * heads * \
        seq_length ** 2 * 4
    return kept + layer


@torch.no_grad()
def hidden_states(model: torch.nn.Module, windows: np.ndarray, sample: Sample,
                  batch_size: int, device: str) -> torch.Tensor:
    """``[layers + 1, len(sample), hidden]`` fp32 on ``device``: the input to layer 0, then
    the residual stream after each layer, at the sampled positions."""
    model.to(device)
    body = model.model
    layers = list(body.layers)
    out = torch.empty(len(layers) + 1, len(sample), model.config.hidden_size, device=device)
    batch = {}  # the current batch's sampled rows and their (window, position) in it

    def keep(index):
        def hook(module, args, output):
            states = output[0] if isinstance(output, tuple) else output
            out[index, batch["rows"]] = states[batch["window"], batch["position"]].float()
        return hook

    hooks = [body.embed_tokens.register_forward_hook(keep(0))]
    hooks += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(layers)]
    window, position = torch.from_numpy(sample.window), torch.from_numpy(sample.position)
    try:
        for start in range(0, windows.shape[0], batch_size):
            stop = min(start + batch_size, windows.shape[0])
            chosen = (window >= start) & (window < stop)
            if not bool(chosen.any()):
                continue
            batch.update(rows=torch.nonzero(chosen).squeeze(1).to(device),
                         window=(window[chosen] - start).to(device),
                         position=position[chosen].to(device))
            body(input_ids=torch.from_numpy(windows[start:stop, :-1]).to(device),
                 use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return out
