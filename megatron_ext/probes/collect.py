"""The fixed token sample and the residual stream at every layer, on it.

Held-out windows (``[n, S + 1]`` ids, :func:`megatron_ext.held_out.cut_windows`) are
split by window into a training half and a scoring half. From positions ``1 .. S-1`` of
every window a fixed random sample of token positions is drawn (each has a previous token
in its context and a next token to predict). The models then run over the windows batch by
batch; hooks on the input (``embed_tokens``) and on every decoder layer keep the hidden
states of the sampled positions only, so memory is ``sample x (layers + 1) x hidden`` floats
plus one batch's activations, whatever the number of held-out tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch


@dataclasses.dataclass
class Sample:
    """Sampled positions ``(window, position)`` with their ids and splits (numpy arrays)."""
    window: np.ndarray
    position: np.ndarray
    current: np.ndarray    # the token at the position
    previous: np.ndarray   # the token before it
    following: np.ndarray  # the token to predict
    train: np.ndarray      # bool: in a training window (else a scoring window)
    early: np.ndarray      # bool: position < S/2 (the position-transfer control)
    seq_length: int

    def __len__(self) -> int:
        return len(self.window)


def draw_sample(windows: np.ndarray, count: int, seed: int) -> Sample:
    """``count`` positions (all of them when fewer) drawn with ``seed``, sorted."""
    n, seq_length = windows.shape[0], windows.shape[1] - 1
    if n < 2 or seq_length < 3:
        raise SystemExit(f"error: probes need at least 2 windows of at least 3 tokens (one "
                         f"half trains, the other scores); the held-out set gives {n} of "
                         f"{seq_length}: raise --tokens")
    rng = np.random.default_rng(seed)
    candidates = n * (seq_length - 1)
    flat = np.sort(rng.choice(candidates, size=min(count, candidates), replace=False))
    window, position = flat // (seq_length - 1), flat % (seq_length - 1) + 1
    train_windows = np.zeros(n, dtype=bool)
    train_windows[rng.permutation(n)[: n // 2]] = True
    return Sample(window=window, position=position, current=windows[window, position],
                  previous=windows[window, position - 1],
                  following=windows[window, position + 1], train=train_windows[window],
                  early=position < seq_length // 2, seq_length=seq_length)


@torch.no_grad()
def hidden_states(model: torch.nn.Module, windows: np.ndarray, sample: Sample,
                  batch_size: int, device: str) -> torch.Tensor:
    """``[layers + 1, len(sample), hidden]`` fp32 on ``device``: the input to layer 0, then
    the residual stream after each layer, at the sampled positions."""
    model.to(device)
    body = model.model
    layers = list(body.layers)
    out = torch.empty(len(layers) + 1, len(sample), model.config.hidden_size, device=device)
    current = {}

    def keep(index):
        return lambda module, args, output: current.__setitem__(index, output)

    hooks = [body.embed_tokens.register_forward_hook(keep(0))]
    hooks += [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(layers)]
    rows = torch.from_numpy(np.arange(len(sample)))
    window, position = torch.from_numpy(sample.window), torch.from_numpy(sample.position)
    try:
        for start in range(0, windows.shape[0], batch_size):
            stop = min(start + batch_size, windows.shape[0])
            ids = torch.from_numpy(windows[start:stop, :-1]).to(device)
            body(input_ids=ids, use_cache=False)
            chosen = (window >= start) & (window < stop)
            if not bool(chosen.any()):
                continue
            w, p = (window[chosen] - start).to(device), position[chosen].to(device)
            for index, states in current.items():
                out[index, rows[chosen].to(device)] = states[w, p].float()
    finally:
        for hook in hooks:
            hook.remove()
    return out
