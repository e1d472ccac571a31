"""Every registered model on every input shape the generators write: it is either refused before
training, with a readable ValueError or RuntimeError (``main.py`` prints its first line, exit
status 2), or it trains: a training step on one sample (two copies with BatchNorm) gives finite
gradients and one logit per class.

A regression: ``-m GoogleNet-GN`` on 28x28 MNIST got past start-up and then crashed on a 1x1 map in
a GroupNorm layer; :func:`flcore.trainmodel.checks.dry_run` now refuses it at start-up (and on
32x32 images, whose maps shrink to 1x1 as well)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from flcore.trainmodel.checks import dry_run
from modelcases import BIG, CASES, Case, build, canonical_names, inputs

#: the inputs the dataset generators write: MNIST/FMNIST/EMNIST, Cifar/Digit5/Office, TinyImagenet,
#: token ids (AGNews, Shakespeare...), HAR's sensor windows and AmazonReview's features
SHAPES = {
    "28x28x1": Case("MNIST", (1, 28, 28), 10),
    "32x32x3": Case("Cifar10", (3, 32, 32), 10),
    "64x64x3": Case("TinyImagenet", (3, 64, 64), 10),
    "tokens": Case("AGNews", (16,), 4, tokens=True),
    "HAR": Case("HAR", (9, 1, 128), 6),
    "Amazon": Case("AmazonReview", (5000,), 2),
}

#: (model, shape) pairs refused at start-up by the dry run (not when built): GoogleNet-GN on small images
#: (GoogLeNet leaves 1x1 maps of both, where GroupNorm layers of one channel per group normalise one value)
DRY_RUN_REFUSALS = {("GoogleNet-GN", "28x28x1"), ("GoogleNet-GN", "32x32x3")}


def params():
    out = []
    for name in canonical_names():
        for shape in SHAPES:
            heavy = name in BIG or (shape == "64x64x3" and name not in ("MLR", "DNN", "MLP", "CNN", "LeNet"))
            out.append(pytest.param(name, shape, marks=pytest.mark.slow, id=f"{name}-{shape}") if heavy
                       else pytest.param(name, shape, id=f"{name}-{shape}"))
    return out


@pytest.mark.parametrize("name,shape", params())
def test_a_model_takes_a_shape_or_is_refused_before_training(name, shape):
    case = SHAPES[shape]
    torch.manual_seed(0)
    x = inputs(case, 2, torch.Generator().manual_seed(1))
    refused = None
    try:
        module = build(name, case)
        dry_run(module, x)
    except (ValueError, RuntimeError, IndexError) as exc:
        refused = exc
    if refused is not None:
        assert str(refused).splitlines()[0].strip(), (name, shape)  # the one line main.py prints
        assert (name, shape) not in DRY_RUN_REFUSALS or "GroupNorm" in str(refused)
        return
    assert (name, shape) not in DRY_RUN_REFUSALS, "this pair must be refused at start-up"
    if CASES[name].tokens != case.tokens:
        pytest.fail(f"{name} took {shape} inputs, which are not its kind")
    module.train()
    batch = x[:2] if any(isinstance(m, _BatchNorm) for m in module.modules()) else x[:1]
    logits = module(batch)
    assert logits.shape == (len(batch), case.num_classes)
    F.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long)).backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


def test_the_dry_run_leaves_the_model_and_the_random_state_as_they_were():
    module = build("CNN-BN", SHAPES["28x28x1"])
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    x = torch.randn(2, 1, 28, 28)
    rng = torch.get_rng_state()
    dry_run(module, x)
    assert module.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
