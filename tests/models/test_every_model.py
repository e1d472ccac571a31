"""Every registered model: a forward and backward pass on its dataset's input shape, as the flat model.

The list is read from the registry, so a new model without a dataset case in ``modelcases.CASES``
fails ``test_every_registered_model_has_a_dataset_case``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flcore.flat import FlatModel
from modelcases import BIG, CASES, build, canonical_names, inputs

NAMES = canonical_names()


def test_every_registered_model_has_a_dataset_case():
    assert sorted(set(NAMES) - set(CASES)) == []
    assert sorted(set(CASES) - set(NAMES)) == []  # and no case for a model that is gone


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in NAMES])
def test_forward_backward_as_flat_model(name):
    case = CASES[name]
    torch.manual_seed(0)
    module = build(name)
    assert isinstance(module.body, nn.Module) and isinstance(module.head, nn.Linear)
    assert module.head.out_features == case.num_classes
    # plain parameters only: weight_norm / parametrisations would re-create weights the flat vector misses
    assert not any(hasattr(m, "parametrizations") for m in module.modules())
    assert not any(name.endswith(("_g", "_v", "_orig")) for name, _ in module.named_parameters())
    flat = FlatModel(module)
    storage = flat.vector.untyped_storage().data_ptr()
    for p in module.parameters():
        assert p.untyped_storage().data_ptr() == storage  # a view of the flat vector
    # the head is exactly the final classifier's weight and bias
    head = flat.head_mask()
    assert int(head.sum()) == module.head.weight.numel() + module.head.bias.numel()

    x = inputs(case, 3, torch.Generator().manual_seed(1))
    y = torch.arange(3) % case.num_classes
    module.train()
    flat.zero_grad()
    logits = module(x)
    assert logits.shape == (3, case.num_classes) and logits.dtype == torch.float32
    F.cross_entropy(logits, y).backward()
    grad = flat.grad
    assert torch.isfinite(grad).all()
    assert grad[head[: flat.num_params]].abs().sum() > 0  # the classifier learns
    if flat.num_params > int(head.sum()):  # MLR's body has no parameters
        assert grad[~head[: flat.num_params]].abs().sum() > 0  # the body learns too

    # loading another vector changes the model that runs (the parameters really are views)
    module.eval()
    with torch.no_grad():
        before = module(x)
        flat.load(flat.vector * 0.5)
        after = module(x)
    assert before.shape == after.shape and not torch.equal(before, after)


@pytest.mark.parametrize("name", ["CNN", "ResNet18", "LSTM", "HARCNN"])
def test_wrong_input_kind_is_a_value_error(name):
    """Image models reject token inputs and text models image inputs when built (main turns the
    ValueError into one line with exit status 2)."""
    case = CASES[name]
    wrong = (16,) if not case.tokens else (1, 28, 28)
    with pytest.raises(ValueError):
        build(name, case._replace(input_shape=wrong))
