"""What a sample's label is, and how a model is trained and scored against it.

A dataset's config.json names it with ``"label_type"`` (absent: ``"class"``, every dataset but
one), and the run takes the matching objective from :data:`OBJECTIVES`:

* ``class`` (one class per sample, ``y`` int64 ``[rows]``): softmax cross-entropy; the headline
  metric is accuracy, a hit per correctly classified sample; the micro-AUC is over the one-hot
  labels (PFLlib's).
* ``multilabel`` (a set of labels per sample, ``y`` int64 ``[rows, T]``: the label ids, padded
  with -1): TensorFlow Federated's StackOverflow tag prediction
  (``tensorflow_federated/python/simulation/baselines/stackoverflow/tag_prediction_tasks.py``,
  the task of Reddi et al., "Adaptive Federated Optimization", ICLR 2021). The loss is Keras'
  ``BinaryCrossentropy`` of the sigmoid outputs against the multi-hot labels: per sample the mean
  over the classes; TFF sums it over the batch (``reduction=SUM``), here it is averaged over the
  batch as every loss of the platform is, so TFF's client learning rate η at batch size B is
  ``-lr`` η·B here. The headline metric is TFF's ``Recall(top_k=5)``, micro-averaged: of all true
  labels of the evaluated samples, the share among each sample's 5 highest scores. A client's
  "test samples" are then its true labels (the metric's denominator), so the platform's sums
  (hits over units, per client and overall) give exactly that micro recall; a sample without a
  true label counts in the loss only. The micro-AUC is over the multi-hot labels and the sigmoid
  scores. TFF's second metric, precision at threshold 0.5, is not computed.

Which algorithms and features can train on a label type other than ``class`` is declared, not
assumed: most read labels in their own ways (a calibrated softmax, prototypes per class, flipped
labels, reconstructed labels), so a class that trains or scores with the objective's loss and
metrics says so in its own body (``objectives = ("class", "multilabel")``, not inherited), and
:func:`refusal` names the first part of a run that does not.
"""
from __future__ import annotations

from typing import Callable, ClassVar, Iterable

import torch
import torch.nn.functional as F

from flcore.registry import OBJECTIVES
from utils.errors import FLError

#: the label type of a dataset whose config.json names none
DEFAULT = "class"


class Objective:
    """The loss and metrics of one label type (module docstring)."""

    name: ClassVar[str]
    #: what the headline metric (``rs_test_acc`` and the summary's accuracies) measures, and its
    #: name in the round log
    metric: ClassVar[str]
    short: ClassVar[str]

    def loss(self, logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        raise NotImplementedError

    def hits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per row, the hits the headline metric counts (float64 ``[rows]``)."""
        raise NotImplementedError

    def units(self, y: torch.Tensor) -> torch.Tensor | None:
        """Per row, what the hits are out of (float64 ``[rows]``); None: one per row."""
        return None

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The scores the micro-AUC ranks."""
        raise NotImplementedError

    def positives(self, y: torch.Tensor, num_classes: int) -> torch.Tensor | None:
        """The micro-AUC's positive entries (bool ``[rows, num_classes]``); None: the one-hot labels."""
        return None


@OBJECTIVES.register("class")
class SingleClass(Objective):
    name = "class"
    metric, short = "accuracy", "acc"

    def loss(self, logits, y, reduction="mean"):
        return F.cross_entropy(logits, y, reduction=reduction)

    def hits(self, logits, y):
        return (logits.argmax(1) == y).double()

    def scores(self, logits):
        return logits.float().softmax(1)


#: TFF's recall metric takes each sample's 5 highest scores (``tf.keras.metrics.Recall(top_k=5)``)
RECALL_AT = 5


@OBJECTIVES.register("multilabel")
class MultiLabel(Objective):
    name = "multilabel"
    metric = short = f"recall@{RECALL_AT}"

    @staticmethod
    def multi_hot(y: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
        """``[rows, num_classes]`` with 1 at each row's label ids (-1 padding dropped)."""
        present = y >= 0
        hot = torch.zeros(*y.shape[:-1], num_classes + 1, dtype=dtype, device=y.device)
        # padding goes to an extra column, then dropped (a scatter, so it runs under vmap)
        index = torch.where(present, y, torch.full_like(y, num_classes))
        hot = hot.scatter(-1, index, torch.ones_like(index, dtype=dtype))
        return hot[..., :num_classes]

    def loss(self, logits, y, reduction="mean"):
        target = self.multi_hot(y, logits.shape[-1], logits.dtype)
        per_sample = F.binary_cross_entropy_with_logits(logits, target, reduction="none").mean(-1)
        if reduction == "none":
            return per_sample
        return per_sample.sum() if reduction == "sum" else per_sample.mean()

    def hits(self, logits, y):
        top = logits.topk(min(RECALL_AT, logits.shape[1]), dim=1).indices  # [rows, k]
        found = (y.unsqueeze(2) == top.unsqueeze(1)) & (y >= 0).unsqueeze(2)  # [rows, T, k]
        return found.any(2).sum(1).double()

    def units(self, y):
        return (y >= 0).sum(1).double()

    def scores(self, logits):
        return logits.float().sigmoid()

    def positives(self, y, num_classes):
        return self.multi_hot(y, num_classes, torch.int8).bool()


def label_type(config: dict) -> str:
    return str(config.get("label_type", DEFAULT))


def objective_of(config: dict) -> Objective:
    """The objective of a dataset's config.json (an unknown label type: one line naming the known)."""
    return OBJECTIVES.get(label_type(config))()


def declares(part: type, name: str) -> bool:
    """Whether ``part`` trains or scores with objective ``name`` (its own declaration; every part
    takes ``class``)."""
    return name == DEFAULT or name in vars(part).get("objectives", ())


def refusal(name: str, parts: Iterable[tuple[str, type]], algorithms: Callable[[], Iterable[str]]) -> None:
    """Refuse in one line a run on label type ``name`` that one of ``parts`` (what the run is
    called, the class) has not declared (module docstring); ``algorithms()``: those that have."""
    if name == DEFAULT:
        return
    for what, part in parts:
        if not declares(part, name):
            fix = (f"the algorithms that train on them: {', '.join(algorithms())}" if what.startswith("-algo")
                   else "run without it")
            raise FLError(f"{what} is not written for {name} labels (config.json's \"label_type\": {name!r}; it "
                          f"takes one class per sample); {fix}")
