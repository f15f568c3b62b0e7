"""The levers toward a higher MFU without Transformer Engine, each against its reference on
CPU: torch's fused AdamW (``--torch-adam-fused``) against its for-each update, also through
the distributed optimizer, interrupted and resumed; Megatron-Core's native fused
cross-entropy (``--cross-entropy-loss-fusion``) against the unfused loss under --bf16. The
fused cross-entropy's functions are torch.compile'd by megatron-core; compiling them on
CPU takes over a minute here, so these runs execute them eagerly (dynamo disabled): the
arithmetic is the one compiled on a GPU, the compilation itself is the GPU check's."""

from __future__ import annotations

import pytest

from conftest import TINY_RUN, run_pretrain, step_losses

STEPS = 6
ARM = ["--input-interface", "binary", "--train-iters", str(STEPS)]


def grad_norms(run) -> dict[int, float]:
    return {r["iteration"]: r["grad-norm"] for r in run.metrics if r["kind"] == "train"}


@pytest.mark.integration
def test_fused_adamw_equals_the_for_each_update_and_resumes(tmp_path, monkeypatch):
    import torch
    calls = []
    fused_update = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: calls.append(1)
                        or fused_update(*a, **k))
    reference = run_pretrain(TINY_RUN + ARM + ["--torch-adam-fused", "off"])
    assert "fused kernel" not in reference.stdout and not calls
    fused = run_pretrain(TINY_RUN + ARM + ["--torch-adam-fused", "on"])
    assert len(calls) >= STEPS  # the fused kernel made the updates
    assert "[fixedcode] optimizer: torch's AdamW with its fused kernel" in fused.stdout
    want = step_losses(reference)
    assert sorted(want) == list(range(1, STEPS + 1)) and want[STEPS] < want[1]
    for it, loss in step_losses(fused).items():
        assert loss == pytest.approx(want[it], abs=1e-5), it
    ckpt = ["--save", tmp_path / "ckpt", "--load", tmp_path / "ckpt", "--torch-adam-fused", "on",
            "--use-distributed-optimizer"]
    first = run_pretrain(TINY_RUN + ARM + ckpt + ["--exit-interval", "3"])
    resumed = run_pretrain(TINY_RUN + ARM + ckpt)
    assert "at iteration 3" in resumed.stdout
    got = {**step_losses(first), **step_losses(resumed)}
    assert sorted(got) == sorted(want)
    for it, loss in got.items():
        assert loss == pytest.approx(want[it], abs=1e-5), it
    # auto: the fused kernel on a GPU only
    assert "fused kernel" not in run_pretrain(TINY_RUN + ARM[:2] + ["--train-iters", "1"]).stdout


@pytest.mark.integration
def test_native_fused_cross_entropy_equals_the_unfused_loss_in_bf16(monkeypatch):
    import torch._dynamo
    from megatron.core.models.common.language_module import language_module
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    calls = []
    fused_loss = language_module.fused_vocab_parallel_cross_entropy
    monkeypatch.setattr(language_module, "fused_vocab_parallel_cross_entropy",
                        lambda *a: calls.append(1) or fused_loss(*a))
    run = TINY_RUN + ARM + ["--bf16"]
    unfused = run_pretrain(run)
    assert not calls  # off on CPU by default
    fused = run_pretrain(run + ["--cross-entropy-loss-fusion"])
    assert len(calls) == 2 * STEPS  # TINY_RUN: 2 micro-batches of 2 per global batch of 4
    assert step_losses(fused) == pytest.approx(step_losses(unfused), abs=1e-6)
    assert grad_norms(fused) == pytest.approx(grad_norms(unfused), rel=1e-5)
    assert step_losses(unfused)[STEPS] < step_losses(unfused)[1]


@pytest.mark.integration
@pytest.mark.parametrize("flags,message", [
    (["--cross-entropy-loss-fusion"], "needs --bf16: megatron-core 0.16.1's native fused "
                                      "cross-entropy rounds the logits' gradient to bf16"),
    (["--cross-entropy-loss-fusion", "--bf16", "--cross-entropy-fusion-impl", "te"],
     "--cross-entropy-fusion-impl te needs Transformer Engine"),
])
def test_a_fusion_that_cannot_apply_is_refused(flags, message):
    run = run_pretrain(TINY_RUN + ARM + flags, check=False)
    assert run.returncode != 0 and message in run.stderr + run.stdout
