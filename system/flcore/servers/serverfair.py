"""FAIR (Deng, Lyu, Ren, Chen, Yang, Zhou, Zhang, INFOCOM 2021, "FAIR: Quality-Aware Federated
Learning with Precise User Incentive and Model Aggregation").

Each round the server

1. **estimates every client's learning quality** from its history. A client that trained in
   round τ measured the quality sample q_i(τ) = max(L_i(w(τ)) − L_i(w_i(τ+1)), 0), the reduction
   of its training loss by its local training: the mean cross-entropy over all its training rows,
   model in eval mode, of the model it received and of the model it uploads. A client would
   report these two numbers; the simulation computes them on the server from the client's own
   rows (the same computation), so the client stays FedAvg's (vectorisable, and data-poisoning
   attacks apply to it). The estimate weighs the client's records with the
   paper's exponential forgetting, newer ones more::

       Q_i = Σ_τ ρ^(t−τ) q_i(τ) / Σ_τ ρ^(t−τ)          (τ: the rounds client i trained in)

   kept as a running numerator and denominator decayed by ρ^(rounds since the last record)
   (``--fair_forgetting ρ``). Only winners get new records, so a client without any needs a
   prior (``--fair_unknown``): ``optimistic`` (default) gives it the highest estimate of the
   clients with records (1 before any), so every client is tried once it is cheap enough;
   ``mean`` gives it their mean. With ``mean`` on MNIST (Dirichlet 0.1, 20 clients, budget 10)
   12 of the 20 clients never trained in 30 rounds: the auction only ever buys known clients.
2. **recruits by reverse auction** under the round's budget (``--budget``): clients bid their
   cost (``flcore/auction.py``: seeded uniform costs in [``--cost_low``, ``--cost_high``]),
   winners are ranked by Q_i / b_i with a proportional-share budget rule and paid a critical unit
   price per quality (``reverse_auction``); ``rs_budget_spent`` is what the round paid. -jr and
   --select do not apply: the budget decides how many clients train (the budget and cost flags
   belong to the ``budget_uniform`` policy, FAIR's fixed one, whose costs it reads).
3. **aggregates by quality**: the uploads are weighted by n_i · q_i(t), the quality measured this
   round times the client's samples, so that equal qualities give FedAvg's weights; uploads that
   did not reduce their loss (q_i(t) = 0) are the paper's non-ideal updates and are left out
   (the model stays as it was when every upload is left out).

The journal version (Deng et al., IEEE TPDS 2022, "Improving Federated Learning With Quality-Aware
User Incentive and Auto-Weighted Model Aggregation") differs in two components, by its abstract:
the aggregation weights are learned by gradient descent ("auto-weighted model aggregation") and
those learned weights, not a loss reduction, are the quality records. ``--fair_aggregation
learned`` runs that variant; its text was not at hand either, so the objective and the data of the
descent are ours, the natural reading: the weights are a softmax over the uploads,
w = softmax(θ), started at FedAvg's sample weights (θ_i = log n_i), and θ takes
``--fair_learn_steps`` full-batch gradient steps of size ``--fair_learn_lr`` on the cross-entropy of
the averaged model Σ_i w_i x_i over the server's public data (``--public_data``, required; model in
eval mode). The global model is that average, and each upload's quality record is its learned
weight times the cohort size (1 for an equal share), so the forgetting estimate and the auction
read it as they read a loss reduction. With ``--fair_learn_lr 0`` the weights stay FedAvg's.

Choices where the paper's text was not at hand offline (read from its abstract and the spec):
the quality sample is the client's own training-loss reduction; the aggregation weight multiplies
it by the sample count; the prior of clients without records (``--fair_unknown``). Baselines at the same budget and
costs: ``--select budget_uniform`` (random order) and ``--select budget_adafl`` (AdaFL's
attention order), both paying bids (``flcore/selectors/budgeted.py``), with ``-algo FedAvg``.
Series: ``rs_budget_spent``, ``rs_quality_estimate`` (every client's Q_i at selection).
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import numpy as np
import torch
import torch.nn.functional as F

from flcore.auction import reverse_auction
from flcore.clients.clientfedavg import FedAvgClient
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from fldata.loading import decode_inputs

log = logging.getLogger("fl")

#: what needs the public data, in the refusal without it
LEARNED = "FAIR --fair_aggregation learned"


def forgetting_update(numerator: float, denominator: float, last_round: int, rnd: int, sample: float,
                      rho: float) -> tuple[float, float]:
    """The running sums after a record ``sample`` in round ``rnd`` (the last one was ``last_round``)."""
    decay = rho ** (rnd - last_round)
    return decay * numerator + sample, decay * denominator + 1.0


def quality_weights(samples: np.ndarray, qualities: np.ndarray) -> np.ndarray:
    """n_i · q_i / Σ_j n_j · q_j (all zeros when no upload has quality)."""
    raw = np.asarray(samples, dtype=np.float64) * np.asarray(qualities, dtype=np.float64)
    return raw / raw.sum() if raw.sum() > 0 else np.zeros_like(raw)


@register_algorithm("FAIR")
class FAIR(Server):
    """Quality estimation, a reverse auction under a budget, quality-weighted aggregation."""

    #: what persists across rounds (checkpoints): the forgetting quality estimates and each client's last record
    carried = ("quality_numerator", "quality_denominator", "last_record")

    client_cls = FedAvgClient
    #: the budgeted policy holds the budget and cost flags and the seeded costs (one declaration for
    #: FAIR and the baselines); FAIR replaces its selection by the auction
    selector_name = "budget_uniform"

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fair_forgetting", type=float, default=0.9, above=0, high=1,
                 help="FAIR: forgetting factor rho of the quality records (1: every record counts alike)")
        add_flag(parser, "--fair_unknown", type=str, default="optimistic", choices=["optimistic", "mean"],
                 help="FAIR: quality estimate of a client without records: the highest or the mean of the known ones")
        add_flag(parser, "--fair_aggregation", type=str, default="quality", choices=["quality", "learned"],
                 help="FAIR: quality: weights n_i * loss reduction (the conference paper); learned: weights learned by "
                      "gradient descent on the server's public data, also the quality records (the journal version; "
                      "needs --public_data)")
        add_flag(parser, "--fair_learn_steps", type=int, default=10, low=1,
                 help="FAIR --fair_aggregation learned: gradient steps on the aggregation weights a round")
        add_flag(parser, "--fair_learn_lr", type=float, default=1.0, low=0,
                 help="FAIR --fair_aggregation learned: step size on the weights' logits (0: FedAvg's weights)")

    @classmethod
    def public_data_user(cls, args) -> str | None:
        return LEARNED if args.fair_aggregation == "learned" else None

    def setup(self) -> None:
        n = len(self.clients)
        self.quality_numerator = np.zeros(n)
        self.quality_denominator = np.zeros(n)
        self.last_record = np.full(n, -1, dtype=np.int64)

    def summary(self) -> dict[str, object]:
        policy = self.selector.hp
        return {"budget": policy.budget, "costs": [policy.cost_low, policy.cost_high],
                "forgetting": self.hp.fair_forgetting, "aggregation": self.hp.fair_aggregation}

    def quality_estimates(self) -> np.ndarray:
        known = self.quality_denominator > 0
        estimates = np.full(len(self.clients), 1.0)
        if known.any():
            estimates[known] = self.quality_numerator[known] / self.quality_denominator[known]
            known_estimates = estimates[known]
            estimates[~known] = known_estimates.max() if self.hp.fair_unknown == "optimistic" else known_estimates.mean()
        return estimates

    def select_clients(self, rnd: int) -> list[int]:
        mask = self.selectable(rnd)
        pool = np.arange(len(self.clients)) if mask is None else np.flatnonzero(mask)
        estimates = self.quality_estimates()
        winners, payments = reverse_auction(estimates[pool], self.selector.costs[pool], self.selector.hp.budget)
        self.history.add_series("quality_estimate", estimates)
        self.history.add_series("budget_spent", float(payments.sum()))
        if not winners:
            log.info("fair: round %d, the auction recruited no client (--budget %g; estimated qualities %s)",
                     rnd, self.selector.hp.budget, np.round(estimates[pool], 4).tolist()[:10])
        return [int(pool[i]) for i in winners]

    def training_loss(self, index: int, params: torch.Tensor) -> float:
        """Mean cross-entropy of ``params`` over client ``index``'s training rows, in eval mode (no
        dropout; BatchNorm's running statistics used, not changed), --eval_batch_size rows a pass."""
        data, model = self.clients[index].data, self.model
        model.load(params)
        was_training = model.module.training
        model.module.eval()
        total, chunk = 0.0, max(1, int(self.args.eval_batch_size))
        with torch.no_grad():
            for start in range(0, data.num_train, chunk):
                rows = slice(start, min(start + chunk, data.num_train))
                total += float(F.cross_entropy(model.module(data.inputs("train", rows)), data.train_y[rows], reduction="sum"))
        model.module.train(was_training)
        return total / data.num_train if data.num_train else 0.0

    def measured_qualities(self, updates: list[ClientUpdate], package: RoundPackage) -> np.ndarray:
        """q_i(t) = max(L_i(received) − L_i(uploaded), 0) of every upload (module docstring)."""
        return np.asarray([max(self.training_loss(u.index, package.global_params) - self.training_loss(u.index, u.params), 0.0)
                           for u in updates])

    def learned_weights(self, updates: list[ClientUpdate]) -> np.ndarray:
        """softmax(θ) after ``--fair_learn_steps`` gradient steps on the public cross-entropy of the
        averaged model, from θ_i = log n_i (FedAvg's weights; module docstring)."""
        public = self.public_data()
        x, y = public.x.to(self.device), public.y.to(self.device)
        table = None if public.table is None else public.table.to(self.device)
        stacked = torch.stack([u.params for u in updates]).to(self.device)
        sizes = torch.tensor([max(u.num_samples, 1) for u in updates], dtype=stacked.dtype, device=self.device)
        theta = sizes.log().requires_grad_(True)
        chunk = max(1, int(self.args.eval_batch_size))
        module = self.model.module
        was_training = module.training
        module.eval()
        for _ in range(self.hp.fair_learn_steps):
            net = self.model.net.at(torch.softmax(theta, 0) @ stacked)
            grad = torch.zeros_like(theta)
            for i in range(0, len(y), chunk):  # a chunk's activations are freed after its gradient
                loss = F.cross_entropy(net(decode_inputs(x[i : i + chunk], table)), y[i : i + chunk], reduction="sum")
                grad += torch.autograd.grad(loss / len(y), theta, retain_graph=True)[0]
            with torch.no_grad():
                theta -= self.hp.fair_learn_lr * grad
        module.train(was_training)
        return torch.softmax(theta.detach().double(), 0).cpu().numpy()

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """Quality-weighted mean of the uploads that reduced their loss (or the learned weights'
        mean); then every upload's quality joins its client's records."""
        if self.hp.fair_aggregation == "learned":
            weights = self.learned_weights(updates)
            qualities = len(updates) * weights
        else:
            qualities = self.measured_qualities(updates, package)
            weights = quality_weights(np.asarray([u.num_samples for u in updates]), qualities)
        if weights.sum() > 0:
            self.global_params = weighted_average(updates, weights)
        rho = self.hp.fair_forgetting
        for update, sample in zip(updates, qualities):
            i = update.index
            last = self.last_record[i] if self.last_record[i] >= 0 else package.round
            self.quality_numerator[i], self.quality_denominator[i] = forgetting_update(
                self.quality_numerator[i], self.quality_denominator[i], int(last), package.round, sample, rho)
            self.last_record[i] = package.round
