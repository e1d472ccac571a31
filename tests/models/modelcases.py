"""Each registered model's dataset: the input shape and class count it is tested on, and inputs."""
from __future__ import annotations

from argparse import Namespace
from typing import NamedTuple

import torch

from flcore.registry import MODELS, load_all


class Case(NamedTuple):
    dataset: str  # the PFLlib dataset the model is meant for
    input_shape: tuple[int, ...]
    num_classes: int
    tokens: bool = False  # integer token ids instead of float inputs


MNIST = Case("MNIST", (1, 28, 28), 10)
CIFAR10 = Case("Cifar10", (3, 32, 32), 10)
AGNEWS = Case("AGNews (sequences shortened to 16 tokens)", (16,), 4, tokens=True)

#: canonical model name -> its dataset
CASES: dict[str, Case] = {
    "MLR": MNIST, "DNN": MNIST, "DNN-PFLlib": MNIST, "MLP": MNIST, "CNN": MNIST, "CNN-BN": MNIST, "LeNet": MNIST,
    "SageflowCNN": MNIST, "SimpleCNN": MNIST,
    **{name: CIFAR10 for name in ("ResNet10", "ResNet18", "ResNet34", "GoogleNet", "MobileNet")},
    **{f"{name}-GN": CIFAR10 for name in ("ResNet10", "ResNet18", "ResNet34", "GoogleNet", "MobileNet")},
    "AlexNet": Case("TinyImagenet", (3, 64, 64), 200),
    "Digit5CNN": Case("Digit5", (3, 32, 32), 10), "Digit5CNN-GN": Case("Digit5", (3, 32, 32), 10),
    "HARCNN": Case("HAR", (9, 1, 128), 6), "VGG9": CIFAR10,
    "AmazonMLP": Case("AmazonReview", (5000,), 2),
    **{name: AGNEWS for name in ("LSTM", "BiLSTM", "fastText", "TextCNN", "Transformer")},
    "BoWLR": Case("StackOverflow tag prediction (16 token ids, 20 tags)", (16,), 20, tokens=True),
}

#: small text sizes: -vs 100, -fd 32 (PFLlib's AGNews run uses -fd 32 too)
TEXT_ARGS = Namespace(vocab_size=100, feature_dim=32, max_len=16)

#: models that take a few seconds to build or run on the 2-core CPU (tens of millions of parameters)
BIG = {"AlexNet", "Digit5CNN", "Digit5CNN-GN", "ResNet34", "ResNet34-GN"}


def canonical_names() -> list[str]:
    """Every registered model once, under the name it was registered with first (aliases skipped)."""
    load_all()
    names = []
    for name in MODELS.names():
        factory = MODELS.get(name)
        if getattr(factory, "registered_name", name) == name:
            names.append(name)
    return names


def build(name: str, case: Case | None = None) -> torch.nn.Module:
    case = case or CASES[name]
    return MODELS.get(name)(case.input_shape, case.num_classes, TEXT_ARGS)


def inputs(case: Case, count: int, generator: torch.Generator) -> torch.Tensor:
    if case.tokens:
        ids = torch.randint(1, TEXT_ARGS.vocab_size, (count, *case.input_shape), generator=generator)
        ids[0, case.input_shape[0] // 2 :] = 0  # one right-padded sequence
        return ids
    return torch.randn(count, *case.input_shape, generator=generator)
