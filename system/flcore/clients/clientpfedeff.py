"""pFedEff client (Shi, Zhang, Fan, Ma, Guan, IEEE TCDS 2024, doi:10.1109/TCDS.2023.3288985).

A round of client i, holding its sparse personal model p_i and its mask (the state ``personal``
and ``mask``, which never leave it), with K = ``-kf``; every mask is layer-wise (each trainable
tensor keeps ⌈K · size⌉ entries; float buffers are never masked):

1. personalised merge: the download (the server's entries chosen by its download importance mask,
   ``serverpfedeff.py``) overwrites those entries of p_i: s = p_i with the downloaded values;
2. pre-training magnitude mask M_pre: the K largest |s| per layer. Training approximates a
   sparsity regulariser on the entries outside it: each SGD step is
   w ← w − η (∇F_i(w) + λ · sign(w) ⊙ (1 − M_pre)), λ = ``--magnitude_decay`` (an L1 penalty on
   the ineffective parameters only, so they shrink before they are cut);
3. post-training magnitude mask M_post: the K largest |w| per layer; p_i ← w ⊙ M_post (the new
   personal model and mask);
4. upload importance mask: of the kept entries, the ⌈K · kept⌉ per layer whose values changed most
   in the round (|p_i − s|) are uploaded, as values plus their indices or bitmap (float buffers
   are always uploaded).

So the personal model keeps K of the model and K·K of it travels each way (the slides' volumes
0.5625/0.25/0.0625 of FedAvg's for K = 0.75/0.5/0.25, there counted without index bytes).
With K = 1 every mask is full, the regulariser vanishes and the round is FedAvg's local training.

The paper's text beyond its abstract was not available to us; the rules above follow the
abstract's five components (two magnitude masks, two importance masks, personalised aggregation)
and the slides' volumes; the importance score (the round's change), the L1 form of the
approximated regulariser and one K for both kinds of mask are our reading, stated here.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientsparse import SparseClient, sparse_update
from flcore.common.sparsemask import decode, encode, keep_largest, param_groups
from cli.flags import add_flag


class PFedEffClient(SparseClient):
    """Merge the download, train with the pre-training mask's regulariser, prune, upload the most
    changed kept entries."""
    hooks_draw_no_rng = True  # decoding and masks by selection (no sampling)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--magnitude_decay", type=float, default=1e-3, low=0,
                 help="λ of pFedEff's approximated regulariser λ·sign(w) on the entries outside the pre-training "
                      "magnitude mask")

    def merged_start(self, package: RoundPackage) -> torch.Tensor:
        """The personal model with the downloaded entries put in."""
        personal = self.personal()
        values, sent = decode(package.payload(self.index), personal.numel())
        return torch.where(sent, values, personal)

    def start_point(self, package: RoundPackage) -> torch.Tensor:
        # the sequence calls begin_round just before: take the merge it made instead of decoding again
        merged = self.__dict__.pop("_merged", None)
        if merged is not None and merged[0] is package:
            return merged[1]
        return self.merged_start(package)

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        start = self.merged_start(package)
        self._merged = (package, start)  # for start_point, next (kept only until then)
        pre_mask = keep_largest(start.abs(), param_groups(self.segments), self.hp.kept_fraction)
        decay = (~pre_mask[: self.task.num_params]).to(start.dtype) * self.hp.magnitude_decay
        return {"start": start, "decay": decay}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        # one fused pass instead of a product then a sum; the same bits (sign · decay is exact)
        return torch.addcmul(g, torch.sign(w), ctx["decay"])

    def end_round(self, params: torch.Tensor, package: RoundPackage, ctx: dict[str, torch.Tensor], steps: int,
                  loss: float) -> ClientUpdate:
        groups = param_groups(self.segments)
        fraction = self.hp.kept_fraction
        post_mask = keep_largest(params.abs(), groups, fraction)
        personal = torch.where(post_mask, params, torch.zeros_like(params))
        self.state.set("personal", self.index, personal)
        self.state.set("mask", self.index, post_mask)
        upload = keep_largest((personal - ctx["start"]).abs(), groups, fraction, eligible=post_mask)
        return sparse_update(self, steps, loss, encode(personal, upload), params)
