"""FedMA: Federated Matched Averaging (Wang, Yurochkin, Sun, Papailiopoulos, Khazaeni, ICLR 2020,
arXiv:2002.06440), for chain models (``flcore/trainmodel/widths.py``): MLR, DNN, MLP (2NN), AmazonMLP,
CNN (FedAvgCNN), CNN-BN, LeNet, HARCNN, VGG9 (the paper's VGG-9: six convolutions in three pooled
blocks and two FC layers, ``flcore/trainmodel/vgg.py``) and Digit5CNN (a VGG-style stack of three
convolutions with BatchNorm and two FC layers); other models (ResNets, GoogLeNet, MobileNet,
GroupNorm variants, text models) are refused in one line.

Rounds (one communication round each; H hidden layers, the head is layer H):

* Layer-wise phase, rounds s = 0..H (Algorithm 2 of the paper): the clients train; the server
  matches hidden layer s across the uploads (BBP-MAP with the Hungarian algorithm,
  ``matching.py``) and averages the matched units; the global layer has as many units as the
  matching opened, at most ⌊(1 + g) · original width⌋ with g = ``--fedma_max_growth``. Layers below s
  stay as matched in earlier rounds; each client receives them, taken at the global units its own
  were matched to (so its model keeps the original widths), frozen, and retrains the layers above
  from its own weights. Round s = H trains only the head, which is averaged class by class,
  weighted by each client's training samples of the class (the paper's last layer).
* Then the paper's further communication rounds ("FedMA with communication", §2.3): each client
  receives the whole global model at the units it was last matched to, trains every layer, and
  the server matches all hidden layers bottom-up again and averages the head by label counts.

Within a round the layers are matched bottom-up: a client's layer is compared in the global input
order (its inputs moved to the global units its units of the layer below were matched to, zero for
global units it does not hold), so the layers above the ones being fixed are matched too; the
global model is complete and evaluated every round (its hidden layers above s are provisional in
the layer-wise phase).

Choices where the paper leaves room: all clients start from the common initial model (sent whole in
round 0); a round's local training is ``-ls`` epochs in both phases (the paper's retraining epochs);
a matched unit is the plain mean of its clients' units (the θ of the paper's squared-cost objective;
not PFNM's posterior mean, not weighted by samples); BBP-MAP's defaults σ = σ0 = γ0 = 1 and 5
passes are the authors' code's. The tests train VGG-9 at a few units a layer; Digit5CNN (25M
parameters) is checked by structure only.

The paper trains every client every round. A client that did not upload in the round a layer was
(re)matched holds no assignment for it; when it next trains it receives the layer's most popular
global units (most clients matched), so with ``-jr`` < 1 or drop-outs it restarts from those.

The global model's widths change between rounds: it lives in a flat model of its own widths
(``MatchedModel``: built from the working model with ``with_widths``, checkpointed with its widths
so a resume rebuilds it), evaluated by its own evaluator; ``rs_widths`` records the hidden widths
after each round. Clients train models of the original widths, so every engine trains them.
"""
from __future__ import annotations

import dataclasses
import math
from argparse import ArgumentParser

import numpy as np
import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedma import FedMAClient
from flcore.evaluation import Evaluator
from flcore.flat import FlatModel
from flcore.registry import register_algorithm
from flcore.common.matching import match_units, matched_average
from flcore.servers.serverbase import Server
from flcore.trainmodel.widths import Chain, NotAChain, chain_of, gather, spread_inputs, with_widths
from cli.flags import add_flag
from utils.errors import FLError
from utils.metrics import EvalResult
from utils.seeding import numpy_rng

class MatchedModel:
    """The global model's module, flat layout and evaluator at its current hidden widths."""

    def __init__(self, template: torch.nn.Module, chain: Chain, server: Server):
        self.template = template
        self.chain = chain
        self.server = server
        self.widths: list[int] | None = None
        self.resize(chain.widths)

    def resize(self, widths: list[int]) -> None:
        if self.widths is not None and list(widths) == self.widths:
            return
        self.widths = [int(w) for w in widths]
        self.flat = FlatModel(with_widths(self.template, self.widths), self.server.device)
        self.evaluator = Evaluator(dataclasses.replace(self.server.runtime, model=self.flat))

    def checkpoint_state(self) -> dict:
        return {"widths": list(self.widths)}

    def load_checkpoint_state(self, state: dict) -> None:
        self.resize(list(state["widths"]))


@register_algorithm("FedMA")
class FedMAServer(Server):
    #: what persists across rounds (checkpoints): the global model's widths, the clients' assignments, the units' popularity, the layer being matched
    carried = ("matched", "widths", "assignments", "popularity", "step")

    client_cls = FedMAClient
    changes_widths = True  # features that mix or replay models in the working widths refuse it (``compatible``)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        # defaults: the values the authors' code (IBM/FedMA) gives its BBP-MAP step
        add_flag(parser, "--fedma_sigma", type=float, default=1.0, above=0,
                 help="σ of BBP-MAP: the std of a client's unit around its global unit")
        add_flag(parser, "--fedma_sigma0", type=float, default=1.0, above=0,
                 help="σ0 of BBP-MAP: the prior std of a global unit")
        add_flag(parser, "--fedma_gamma", type=float, default=1.0, above=0,
                 help="γ0 of BBP-MAP: the Indian buffet's mass; larger opens new global units more easily")
        add_flag(parser, "--fedma_iterations", type=int, default=5, low=1,
                 help="BBP-MAP passes over the clients per layer (the first adds them one by one)")
        add_flag(parser, "--fedma_max_growth", type=float, default=0.5, low=0,
                 help="a global hidden layer has at most (1 + this) x its original width units (0: never grows)")

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        try:
            chain = chain_of(self.model.module)
        except NotAChain as why:
            raise FLError(f"FedMA matches the units of chain models (MLR, DNN, MLP, AmazonMLP, CNN, CNN-BN, LeNet, "
                          f"HARCNN, VGG9, Digit5CNN); -m {self.args.model} does not fit: {why}") from None
        taker = next((name for name, p in self.plugins.items() if p.takes_aggregation), None)
        if taker is not None:
            raise FLError(f"FedMA aggregates by matching units, which the {taker} plug-in's own aggregation "
                          "would replace; drop the option that makes it aggregate")
        self.original_widths = chain.widths
        self.step = 0  # aggregations done: the layer-wise phase is steps 0..H
        self.widths = list(chain.widths)
        #: assignments[j][k]: client j's units of hidden layer k -> global units (None: not held)
        self.assignments: list[list[np.ndarray | None]] = [
            [np.arange(w, dtype=np.int64) for w in chain.widths] for _ in self.clients]
        #: popularity[k]: how many clients were matched to each global unit of layer k
        self.popularity: list[np.ndarray] = [np.full(w, len(self.clients), dtype=np.int64) for w in chain.widths]
        self.matched = MatchedModel(self.model.module, chain, self)
        masks = self.layer_masks(chain)
        initial = self.global_params.clone()
        for client in self.clients:
            client.configure(layer_masks=masks, initial_params=initial)

    def layer_masks(self, chain: Chain) -> torch.Tensor:
        """Row k: the entries of hidden layer k (its weight, bias and BatchNorm), last row the head."""
        groups = [(layer.weight, layer.bias, *layer.norm) for layer in chain.hidden]
        groups.append((chain.head_weight, chain.head_bias))
        masks = torch.zeros(len(groups), self.model.num_total, dtype=torch.bool, device=self.device)
        for row, names in enumerate(groups):
            for seg in self.model.segments:
                if seg.name in names:
                    masks[row, seg.start : seg.stop] = True
        return masks

    def summary(self) -> dict[str, object]:
        return {"sigma": self.hp.fedma_sigma, "sigma0": self.hp.fedma_sigma0, "gamma": self.hp.fedma_gamma,
                "iterations": self.hp.fedma_iterations, "max_growth": self.hp.fedma_max_growth,
                "widths": self.original_widths}

    # ------------------------------------------------------------------ rounds
    @property
    def hidden(self) -> int:
        return len(self.original_widths)

    def phase(self) -> tuple[int, int]:
        """(layers received, layers frozen) this round. The first round sends the whole initial model
        (what the clients start from, counted as FedAvg's first download is)."""
        if self.step == 0:
            return self.hidden + 1, 0
        if self.step <= self.hidden:
            return self.step, self.step
        return self.hidden + 1, 0

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        received, frozen = self.phase()
        payloads = {}
        named = self.matched.flat.unflatten(self.global_params, params_only=False)
        for i in cohort:
            self.hold_assignments(i)
            local = torch.zeros_like(self.clients[i].initial_params)
            views = self.model.unflatten(local, params_only=False)
            for name, value in gather(named, self.matched.chain, self.assignments[i]).items():
                views[name].copy_(value)
            mask = self.clients[i].layer_masks[:received].any(0)
            payloads[i] = {"model": local[mask]}
        extras = {"received_layers": torch.tensor(received), "frozen_layers": torch.tensor(frozen)}
        return RoundPackage(rnd, self.global_params.new_empty(0), cohort, extras=extras, payloads=payloads)

    def hold_assignments(self, index: int) -> None:
        """Give client ``index`` an assignment for every hidden layer it holds none of: the layer's
        most popular global units (what it receives of the layer, if it receives it)."""
        for k in range(self.hidden):
            if self.assignments[index][k] is None:
                order = np.argsort(-self.popularity[k], kind="stable")
                self.assignments[index][k] = np.sort(order[: self.original_widths[k]])

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        chain = self.matched.chain
        _, fixed = self.phase()
        uploads = [self.model.unflatten(u.params, params_only=False) for u in updates]
        held = [self.assignments[u.index] for u in updates]
        current = self.matched.flat.unflatten(self.global_params, params_only=False)
        out: dict[str, torch.Tensor] = {}
        widths = list(self.widths)
        new_assignments = [list(a) for a in held]
        below: list[np.ndarray | None] = [None] * len(updates)
        for k, layer in enumerate(chain.hidden):
            names = [n for n in (layer.weight, layer.bias, *layer.norm) if n is not None]
            if k < fixed:  # matched in an earlier round: kept, and so are the clients' assignments
                out.update({n: current[n] for n in names})
            else:
                inputs = widths[k - 1] if k else 0
                weights = [spread_inputs(up[layer.weight], b, layer.spatial, inputs) for up, b in zip(uploads, below)]
                features = [self.features(w, up, layer.bias) for w, up in zip(weights, uploads)]
                limit = math.floor(self.original_widths[k] * (1 + self.hp.fedma_max_growth))
                chosen, widths[k] = match_units(features, self.hp.fedma_sigma ** 2, self.hp.fedma_sigma0 ** 2,
                                                self.hp.fedma_gamma, limit, self.hp.fedma_iterations,
                                                numpy_rng(self.args.seed, "fedma-match", package.round, k))
                out[layer.weight] = matched_average(weights, chosen, widths[k])
                for name in names[1:]:
                    out[name] = matched_average([up[name] for up in uploads], chosen, widths[k])
                for j, c in enumerate(chosen):
                    new_assignments[j][k] = c
                self.popularity[k] = np.bincount(np.concatenate(chosen), minlength=widths[k])
            below = [a[k] for a in new_assignments]
        out.update(self.head_by_label_counts(updates, uploads, below, widths))
        self.install(widths, out)
        seen = set()
        for update, assignment in zip(updates, new_assignments):
            self.assignments[update.index] = assignment
            seen.add(update.index)
        for index in set(range(len(self.clients))) - seen:  # rematched layers' units are not theirs
            for k in range(fixed, self.hidden):
                self.assignments[index][k] = None
        self.step += 1

    @staticmethod
    def features(weight: torch.Tensor, upload: dict[str, torch.Tensor], bias: str | None) -> np.ndarray:
        """What BBP-MAP compares of each unit: its weights (global input order) and its bias."""
        rows = weight.reshape(weight.shape[0], -1)
        if bias is not None:
            rows = torch.cat([rows, upload[bias].reshape(-1, 1)], 1)
        return rows.detach().to("cpu", torch.float64).numpy()

    def head_by_label_counts(self, updates: list[ClientUpdate], uploads: list[dict], below: list, widths: list[int]):
        """The head: class c's weights (and bias) averaged over the clients, weighted by their
        training samples of class c (the plain mean for a class no uploader holds)."""
        chain = self.matched.chain
        inputs = widths[-1] if widths else 0
        counts = torch.stack([u.extras["label_counts"] for u in updates]).to(torch.float64)
        totals = counts.sum(0)
        weights = torch.where(totals > 0, counts / totals.clamp(min=1), torch.full_like(counts, 1 / len(updates)))
        names = [chain.head_weight] + ([chain.head_bias] if chain.head_bias is not None else [])
        out = {}
        for name in names:
            tensors = [up[name] for up in uploads]
            if name == chain.head_weight:
                tensors = [spread_inputs(t, b, chain.head_spatial, inputs) for t, b in zip(tensors, below)]
            stacked = torch.stack(tensors).to(torch.float64)
            shape = weights.shape + (1,) * (stacked.dim() - 2)
            out[name] = (stacked * weights.to(stacked.device).reshape(shape)).sum(0).to(tensors[0].dtype)
        return out

    def install(self, widths: list[int], named: dict[str, torch.Tensor]) -> None:
        """The global model becomes ``named`` at ``widths``."""
        self.matched.resize(widths)
        self.widths = list(self.matched.widths)
        vector = self.matched.flat.snapshot()
        views = self.matched.flat.unflatten(vector, params_only=False)
        for name, view in views.items():
            view.copy_(named[name])
        self.global_params = vector

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        self.history.add_series("widths", list(self.widths))
        super().after_round(rnd, package, updates)

    # -------------------------------------------------------------- evaluation, saving
    def evaluate(self, rnd: int) -> EvalResult:
        # the matched evaluator takes the round's --eval_clients sample too (the base one records it)
        self.matched.evaluator.at_round(rnd, record=False)
        return super().evaluate(rnd)

    def evaluate_models(self, params_for, train_loss: bool = True) -> EvalResult:
        return self.matched.evaluator.evaluate(params_for, train_loss)

    def model_of(self, params: torch.Tensor) -> FlatModel:
        return self.matched.flat
