"""The estimators, in PyTorch (CPU or GPU), each one closed-form pass over a layer's states.

* :func:`ridge`: ``W = (XᵀX + λ·tr(XᵀX)/d·I)⁻¹ XᵀY`` on centred features and targets, for
  many targets at once (one solve per layer). Binary labels are regressed as ±1 and read by
  their sign, classes one-hot and read by the argmax: a ridge classifier.
* :func:`next_token`: next-token loss and top-1 accuracy of states read out by the model's
  own final norm and head (the logit lens), in chunks of rows.
* :func:`linear_cka`: Kornblith et al. 2019, ``‖YᵀX‖²_F / (‖XᵀX‖_F·‖YᵀY‖_F)`` on
  column-centred states; 1 for representations equal up to rotation and scale.
"""

from __future__ import annotations

from typing import Callable

import torch


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


@torch.no_grad()
def next_token(model: torch.nn.Module, states: torch.Tensor, targets: torch.Tensor,
               chunk: int = 1024) -> tuple[float, float]:
    """``(mean loss, top-1 accuracy)`` of ``lm_head(norm(states))`` against ``targets``."""
    norm, head = model.model.norm, model.lm_head
    loss, correct = 0.0, 0
    for start in range(0, len(states), chunk):
        logits = head(norm(states[start:start + chunk].float())).float()
        t = targets[start:start + chunk]
        loss += float(torch.nn.functional.cross_entropy(logits, t, reduction="sum"))
        correct += int((logits.argmax(-1) == t).sum())
    return loss / len(states), correct / len(states)


def linear_cka(X: torch.Tensor, Y: torch.Tensor) -> float:
    X, Y = X.double(), Y.double()
    X, Y = X - X.mean(0), Y - Y.mean(0)
    cross = torch.linalg.matrix_norm(Y.T @ X) ** 2
    return float(cross / (torch.linalg.matrix_norm(X.T @ X) * torch.linalg.matrix_norm(Y.T @ Y)))
