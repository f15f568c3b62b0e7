"""The estimators, in PyTorch (CPU or GPU), each one closed-form pass over a layer's states.

* :func:`ridge`: ``W = (XᵀX + λ·tr(XᵀX)/d·I)⁻¹ XᵀY`` on centred features and targets, for
  many targets at once (one solve per layer). Binary labels are regressed as ±1 and read by
  their sign, classes one-hot and read by the argmax: a ridge classifier.
* :func:`choose_penalty`: the relative penalty λ of :data:`PENALTIES` with the least squared
  error on held-out folds of the training rows (folds are whole documents), from one
  eigendecomposition per fold.
* :func:`next_token`: next-token loss and top-1 hit of each row of states read out by the
  model's own final norm and head (the logit lens), in chunks of rows.
* :func:`cka`: debiased linear CKA (Kornblith et al. 2019 with the unbiased HSIC estimator of
  Song et al. 2012), computed from the features without ``n × n`` Gram matrices: 1 for
  representations equal up to rotation and scale, about 0 (of either sign) for independent
  ones, whatever the width (the biased form reads 0.33 there at n 4,096, width 2,048);
  :func:`cka_floor` its noise floor, the largest ``|CKA|`` against row-permuted partners.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # relative to the mean eigenvalue of XᵀX


def ridge(X: torch.Tensor, Y: torch.Tensor, penalty: float
          ) -> Callable[[torch.Tensor], torch.Tensor]:
    """Fit ``Y ≈ X W + c`` (fp64) and return the predictor ``X' -> X' W + c``."""
    X, Y = X.double(), Y.double()
    x_mean, y_mean = X.mean(0), Y.mean(0)
    Xc = X - x_mean
    gram = Xc.T @ Xc
    scale = penalty * gram.diagonal().mean().clamp_min(1e-12)
    gram.diagonal().add_(scale)
    W = torch.linalg.solve(gram, Xc.T @ (Y - y_mean))
    return lambda Z: (Z.double() - x_mean) @ W + y_mean


def choose_penalty(X: torch.Tensor, Y: torch.Tensor, folds: np.ndarray,
                   penalties: Sequence[float] = PENALTIES) -> float:
    """The penalty of ``penalties`` whose fits on all folds but one predict ``Y`` of the
    held-out fold best (summed squared error over the folds). ``folds``: each row's fold."""
    X, Y = X.double(), Y.double()
    errors = torch.zeros(len(penalties), dtype=torch.float64, device=X.device)
    for fold in np.unique(folds):
        held = torch.from_numpy(folds == fold).to(X.device)
        Xt, Yt = X[~held], Y[~held]
        x_mean, y_mean = Xt.mean(0), Yt.mean(0)
        Xt = Xt - x_mean
        values, vectors = torch.linalg.eigh(Xt.T @ Xt)
        projected = vectors.T @ (Xt.T @ (Yt - y_mean))   # [d, targets]
        held_x = (X[held] - x_mean) @ vectors             # [held rows, d]
        truth = Y[held] - y_mean
        scale = values.clamp_min(0).mean().clamp_min(1e-12)
        for i, penalty in enumerate(penalties):
            guess = held_x @ (projected / (values.clamp_min(0) + penalty * scale)[:, None])
            errors[i] += ((guess - truth) ** 2).sum()
    return float(penalties[int(errors.argmin())])


@torch.no_grad()
def next_token(model: torch.nn.Module, states: torch.Tensor, targets: torch.Tensor,
               chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, on the CPU: the loss and top-1 hit (1.0 or 0.0) of
    ``lm_head(norm(states))`` against ``targets``."""
    norm, head = model.model.norm, model.lm_head
    losses, hits = [], []
    for start in range(0, len(states), chunk):
        logits = head(norm(states[start:start + chunk].float())).float()
        t = targets[start:start + chunk]
        losses.append(torch.nn.functional.cross_entropy(logits, t, reduction="none").cpu())
        hits.append((logits.argmax(-1) == t).double().cpu())
    return torch.cat(losses).double(), torch.cat(hits)


def _hsic_terms(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of the linear Gram ``K = XXᵀ`` with its diagonal zeroed (K̃): ``diag(K)``, ``K̃·1``
    and ``1ᵀK̃1``, from the features alone."""
    diagonal = (X * X).sum(1)
    row_sums = X @ X.sum(0) - diagonal
    return diagonal, row_sums, row_sums.sum()


def _hsic(X: torch.Tensor, Y: torch.Tensor, x_terms, y_terms) -> torch.Tensor:
    """The unbiased HSIC estimator of Song et al. (2012) for linear kernels (n >= 4)."""
    n = X.shape[0]
    dx, rx, sx = x_terms
    dy, ry, sy = y_terms
    cross = X.T @ Y if X.shape[1] * Y.shape[1] <= n * n else None
    trace = (torch.linalg.matrix_norm(cross) ** 2 if cross is not None
             else ((X @ X.T) * (Y @ Y.T)).sum()) - (dx * dy).sum()
    return (trace + sx * sy / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (rx @ ry)) / (n * (n - 3))


def cka(X: torch.Tensor, Y: torch.Tensor) -> float:
    """Debiased linear CKA of two representations of the same ``n`` rows (fp64)."""
    X, Y = X.double(), Y.double()
    X, Y = X - X.mean(0), Y - Y.mean(0)
    if X.shape[0] < 4:
        raise ValueError(f"debiased CKA needs at least 4 rows, got {X.shape[0]}")
    tx, ty = _hsic_terms(X), _hsic_terms(Y)
    xy, xx, yy = _hsic(X, Y, tx, ty), _hsic(X, X, tx, tx), _hsic(Y, Y, ty, ty)
    return float(xy / torch.sqrt((xx * yy).clamp_min(1e-300)))


def cka_floor(X: torch.Tensor, Y: torch.Tensor, seed: int, permutations: int = 4) -> float:
    """The noise floor of :func:`cka` on these features: the largest ``|CKA|`` of ``X``
    against ``Y`` with its rows permuted (the pairing broken), over ``permutations`` draws."""
    gen = torch.Generator().manual_seed(seed)
    return max(abs(cka(X, Y[torch.randperm(len(Y), generator=gen).to(Y.device)]))
               for _ in range(permutations))
