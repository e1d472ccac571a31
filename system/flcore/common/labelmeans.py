"""Per-class means that travel instead of a model: FedProto's prototypes, FD's logits, FedGH's
representations.

A client sends, for each class it holds, the mean of some vector (the body's features, the
logits) over its samples of that class, with the class label and the class's sample count. Only
the classes it holds travel, so the upload is ``k`` labels (int64), ``k`` counts and a ``[k, d]``
block of means; :func:`upload` packs them, the server reads them back with :func:`uploaded`.

:func:`start_sums` / :func:`accumulate` collect the means *during* local training, as FedProto's
and FD's authors' code and PFLlib do: the loss hook adds each minibatch's detached vectors to
per-class sums held in the round's context (tensors of this client's job only, so the threaded
engine may run the hook in a worker). :func:`class_means` of a whole split under a fixed model is
the other reading (after training, FedGH's).
"""
from __future__ import annotations

import torch

from utils.errors import FLError

#: the names of the tensors of an upload (:func:`upload`)
LABELS, MEANS, COUNTS = "labels", "means", "counts"


def start_sums(num_classes: int, dim: int, like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Empty per-class sums for a round's context (``like`` gives dtype and device)."""
    return {"class_sums": like.new_zeros(num_classes, dim), "class_seen": like.new_zeros(num_classes)}


def accumulate(ctx: dict[str, torch.Tensor], vectors: torch.Tensor, y: torch.Tensor) -> None:
    """Add a minibatch's ``vectors`` (``[b, d]``, detached here) to the sums of their classes."""
    ctx["class_sums"].index_add_(0, y, vectors.detach().flatten(1).to(ctx["class_sums"].dtype))
    ctx["class_seen"].index_add_(0, y, torch.ones_like(y, dtype=ctx["class_seen"].dtype))


def upload(sums: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The classes seen at least once: their labels, mean vectors and, when given, their sample
    counts ``counts`` (the client's number of training samples of each class, ``|D_{i,j}|``)."""
    labels = torch.nonzero(seen > 0).flatten()
    means = sums[labels] / seen[labels].unsqueeze(1)
    sent = {LABELS: labels, MEANS: means}
    if counts is not None:
        sent[COUNTS] = counts[labels].to(means.dtype)
    return sent


def uploaded(extras: dict[str, torch.Tensor], num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An upload spread over every class: (``[C, d]`` means, zero where absent; ``[C]`` counts,
    1 for each class sent when the upload has no counts)."""
    labels, means = extras[LABELS], extras[MEANS]
    dense = means.new_zeros(num_classes, means.shape[1])
    dense[labels] = means
    counts = means.new_zeros(num_classes)
    counts[labels] = extras[COUNTS] if COUNTS in extras else 1.0
    return dense, counts


def average(uploads: list[dict[str, torch.Tensor]], num_classes: int, dim: int, weighting: str,
            like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-class average of the uploads, over the clients that sent the class:
    ``weighting="samples"`` weights client i's mean by its share |D_{i,j}| / Σ_i |D_{i,j}| of the
    class's samples, ``"uniform"`` takes the plain mean of the client means (PFLlib). Returns
    (``[C, d]`` means, zero for classes nobody sent; ``[C]`` bool: which classes were sent)."""
    total = like.new_zeros(num_classes, dim, dtype=torch.float64)
    weight = like.new_zeros(num_classes, dtype=torch.float64)
    for extras in uploads:
        means, counts = uploaded(extras, num_classes)
        w = counts.double() if weighting == "samples" else (counts > 0).double()
        total += w.unsqueeze(1) * means.double()
        weight += w
    present = weight > 0
    out = torch.where(present.unsqueeze(1), total / weight.clamp_min(1e-300).unsqueeze(1), 0.0)
    return out.to(like.dtype), present


def class_means(vectors: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``[C, d]`` per-class sums, ``[C]`` per-class counts) of ``vectors`` labelled ``y``."""
    flat = vectors.flatten(1)
    sums = flat.new_zeros(num_classes, flat.shape[1]).index_add_(0, y, flat)
    seen = flat.new_zeros(num_classes).index_add_(0, y, torch.ones_like(y, dtype=flat.dtype))
    return sums, seen


def require_body_head(module: torch.nn.Module, algorithm: str, model_name: str) -> None:
    """Refuse (one line, exit 2) a model without a ``body`` (features) / ``head`` (classifier) split."""
    if not all(isinstance(getattr(module, part, None), torch.nn.Module) for part in ("body", "head")):
        raise FLError(f"{algorithm} needs a model split into body (features) and head (classifier); "
                      f"-m {model_name} has no such split")


def require_linear_head(module: torch.nn.Module, algorithm: str, model_name: str, *, bias: bool = False) -> None:
    """Refuse (one line, exit 2) a model whose ``head`` is not one Linear layer (with a bias, when
    ``bias``): the methods that read or rewrite the classifier's weight matrix."""
    head = getattr(module, "head", None)
    if not isinstance(head, torch.nn.Linear) or (bias and head.bias is None):
        raise FLError(f"{algorithm} needs a model whose head is one Linear layer{' with a bias' if bias else ''}; "
                      f"-m {model_name}'s is not (e.g. -m CNN, DNN, ResNet18)")


@torch.no_grad()
def body_class_sums(client, model, normalise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums and counts of the body's output (L2-normalised with ``normalise``) over
    ``client``'s training data under the working ``model``, in eval mode, in batches of
    ``--eval_batch_size``: the one extra pass of FedGH, FedPAC and FedPCL after training."""
    module = model.module
    was_training = module.training
    module.eval()
    batch = int(client.args.eval_batch_size)
    sums = seen = None
    try:
        for start in range(0, client.num_train, batch):
            rows = slice(start, start + batch)
            z = module.body(client.data.inputs("train", rows)).flatten(1)
            part = class_means(torch.nn.functional.normalize(z, dim=1) if normalise else z,
                               client.data.train_y[rows], client.task.num_classes)
            sums, seen = part if sums is None else (sums + part[0], seen + part[1])
    finally:
        module.train(was_training)
    return sums, seen
