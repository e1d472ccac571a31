"""Sageflow (Park, Han, Choi & Moon, NeurIPS 2021, "Sageflow: Robust Federated Learning against Both
Stragglers and Adversaries"): the server. Clients are FedAvg's.

In round t the server receives fresh uploads (trained from w_t) and late ones (trained from an older
w_τ; stragglers come from ``--straggler_delay``, ``features/stragglers.py``). It scores every upload
w_k on its own public data (``--public_data``, ``fldata/public.py``): E_k, the mean prediction
entropy −Σ_c p_c log p_c over the public samples, and ℓ_k, the mean cross-entropy loss on them. Then:

1. **Staleness-aware grouping**: the uploads of round t are grouped by the round τ they started from.
2. **Entropy-based filtering**: an upload with E_k ≥ E_th (``--sageflow_eth``) is dropped (a
   poisoned model predicts with little confidence on clean data).
3. **Loss-weighted averaging** in each group: v_τ = Σ_k β_k w_k with β_k ∝ m_k / ℓ_k^δ over the kept
   uploads (m_k: training samples, δ = ``--sageflow_delta``).
4. **Mixing of the groups**: z = Σ_τ α_τ v_τ with α_τ ∝ M_τ · (t − τ + 1)^(−λ) (M_τ: the kept
   samples of group τ, λ = ``--sageflow_lambda``), and w_{t+1} = (1 − γ_t) w_t + γ_t z,
   γ_t = ``--sageflow_gamma``, halved every ``--sageflow_gamma_halving`` rounds when that is > 0.

A group whose uploads are all filtered out counts for nothing; when every upload of a round is
filtered, the global model stays as it is.

``--sageflow_diagnostics True`` records, per round, how Sageflow's step compares with the step that
ignoring stragglers would have taken from the same global model w_t with the same fresh uploads
(f: their sample-weighted mean, unfiltered, as FedAvg with ``--straggler_policy ignore`` makes it);
with s = w_{t+1} − w_t, s_f = f − w_t and, over the stale groups (τ < t) with their weights
ᾱ_τ = α_τ / Σ_{τ<t} α_τ, the stale mix z_s = Σ ᾱ_τ v_τ:

* ``rs_sageflow_stale_weight`` Σ_{τ<t} α_τ (0 in a round without a stale group);
* ``rs_sageflow_step_norm`` ‖s‖, ``rs_sageflow_fresh_step_norm`` ‖s_f‖, ``rs_sageflow_step_along_fresh``
  ⟨s, s_f⟩ / ‖s_f‖² (the share of ignoring's step Sageflow takes along it);
* ``rs_sageflow_stale_step_norm`` ‖z_s − w_t‖ and ``rs_sageflow_stale_fresh_cos`` cos(z_s − w_t, s_f);
  z_s − w_t splits into the pull back to the older models, Σ ᾱ_τ (w_τ − w_t)
  (``rs_sageflow_stale_pull_norm``), and the stale uploads' own training, Σ ᾱ_τ (v_τ − w_τ)
  (``rs_sageflow_stale_progress_norm``, ``rs_sageflow_stale_progress_cos`` its cosine with s_f);
  NaN in a round without a stale group, and every number that needs s_f in a round without a fresh
  upload (ignoring stragglers would not move);
* ``rs_sageflow_next_acc`` and ``rs_sageflow_fresh_only_acc``: the test accuracy of w_{t+1} and of
  f, by the run's own evaluation (two extra evaluations a round).

They read the round's tensors and evaluate on the working model, as every evaluation does; no random
draw and no state is changed, so a run's numbers are those of the run without them. ``rs_sageflow_filtered`` records how many uploads were
dropped each round and, with ``--attack``, ``rs_sageflow_precision`` / ``rs_sageflow_recall`` the
precision and recall of the attackers among them (an upload's attacker status is the ground truth
the attack plug-in stamps on it, that of the round it was trained in; NaN where nothing was dropped
or no attacker uploaded).

E_th = 1 (the official value) assumes local models that predict confidently: with short local
training an honest upload's mean entropy on the public data can still be ≥ 1. On MNIST and
Fashion-MNIST shards with E = 1 over ~140 rows (14 steps a round) it dropped 12–17% of the honest
uploads of a stragglers-only run (on MNIST half of them in the first five rounds; on Fashion-MNIST
about one in ten to the end of a 30-round run; docs/results/robustness.md,
"Waiting for all, the entropy filter and FedAsync's regulariser"); the official runs train E = 5 over
~600 rows. ``--sageflow_eth inf`` turns the filter off where no attacker is expected.

Reduction: without stragglers, with E_th = inf, δ = 0 and γ = 1 (no halving), the new global model is
FedAvg's sample-weighted average of the round's uploads, bit for bit.

Choices where the paper and the official code (savertm/Sageflow) differ, deliberately made here:

* β_k and α_τ carry the data sizes m_k (the paper's form); the official code weighs by 1/ℓ_k^δ and
  by the number of kept models, which is the same for its equal shards.
* γ: the official code has no constant γ; its ``Sag()`` mixes with the previous global model by
  0.5^(t // 15) on MNIST, 0.5^(t // 20) on FMNIST, 0.5^(t // 300) on CIFAR-10, a decay the paper does
  not mention. Here γ defaults to 1 (the official value before its first halving) and the decay is
  the explicit ``--sageflow_gamma_halving R`` (γ_t = γ · 0.5^(t // R)), off by default; its
  settings are ``--sageflow_gamma 1 --sageflow_gamma_halving 15`` (MNIST) or ``20`` (FMNIST).
* E_k and ℓ_k are exact means over the public samples (the official code averages per-batch means
  of 64 samples, which weighs the last, smaller batch more).
* The official scheduler gives the first S + 1 clients of each round delays 0, 1, ..., S (so no
  group is empty) and never selects a client whose upload is still in flight; here every delay
  is drawn from the stragglers plug-in (uniform in {0..S}, from the seed) and the selection is the
  platform's.
"""
from __future__ import annotations

import logging

from argparse import ArgumentParser

import numpy as np
import torch
import torch.nn.functional as F

from flcore.protocol import ClientUpdate, RoundPackage, filter_precision_recall
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag

log = logging.getLogger("fl")

#: public samples scored in one forward pass (bounds the activation memory of large public sets)
SCORE_BATCH = 1024


def public_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """(mean prediction entropy, mean cross-entropy loss) of ``logits`` on the public ``labels``."""
    log_p = F.log_softmax(logits.double(), dim=1)
    entropy = -(log_p.exp() * log_p).sum(1).mean()
    loss = F.nll_loss(log_p, labels)
    return float(entropy), float(loss)


def loss_weights(samples: list[int], losses: list[float], delta: float) -> np.ndarray:
    """β_k ∝ m_k / ℓ_k^δ, normalised (δ = 0: the sample weights FedAvg uses)."""
    raw = np.asarray(samples, dtype=np.float64) / np.asarray(losses, dtype=np.float64) ** delta
    return raw / raw.sum()


def group_weights(samples: list[float], staleness: list[int], lam: float) -> np.ndarray:
    """α_τ ∝ M_τ · (staleness + 1)^(−λ), normalised."""
    raw = np.asarray(samples, dtype=np.float64) * (np.asarray(staleness, dtype=np.float64) + 1) ** (-lam)
    return raw / raw.sum()


def halved_gamma(gamma: float, halving: int, rnd: int) -> float:
    """γ_t: ``gamma`` halved every ``halving`` rounds (0: never)."""
    return gamma * (0.5 ** (rnd // halving) if halving else 1.0)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b); NaN when either is zero."""
    norms = float(a.norm() * b.norm())
    return float(a.dot(b)) / norms if norms > 0 else float("nan")


@register_algorithm("Sageflow")
class SageflowServer(Server):
    """Staleness-aware grouping, entropy-based filtering, loss-weighted averaging (module docstring)."""

    #: what persists across rounds (checkpoints): the notice said once
    carried = ("_said_all_filtered",)

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--sageflow_eth", type=float, default=1.0, above=0, finite=False,
                 help="Sageflow: entropy threshold E_th (nats); uploads whose mean prediction entropy on the "
                      "public data is >= E_th are filtered out (inf: none)")
        add_flag(parser, "--sageflow_delta", type=float, default=1.0, low=0,
                 help="Sageflow: exponent delta of the loss weights m_k / loss_k^delta (0: sample weights)")
        add_flag(parser, "--sageflow_lambda", type=float, default=0.5, low=0,
                 help="Sageflow: staleness exponent lambda of the group weights M_tau (t - tau + 1)^-lambda")
        add_flag(parser, "--sageflow_gamma", type=float, default=1.0, above=0, high=1,
                 help="Sageflow: mixing weight gamma, w <- (1 - gamma) w + gamma z")
        add_flag(parser, "--sageflow_gamma_halving", type=int, default=0, low=0,
                 help="Sageflow: halve gamma every R rounds (the official code's hidden decay: 15 for MNIST, "
                      "20 for FMNIST); 0: off")
        add_flag(parser, "--sageflow_diagnostics", type=bool, default=False,
                 help="Sageflow: record each round's step against the fresh-only step that ignoring stragglers "
                      "would take (norms, cosines, the stale groups' weight, both models' test accuracy: "
                      "rs_sageflow_*); two extra evaluations a round, the run's numbers unchanged")

    @classmethod
    def public_data_user(cls, args) -> str | None:
        return "Sageflow"

    def setup(self) -> None:
        self._said_all_filtered = False
        public = self.public_data()
        self.public_x = public.x.to(self.device)
        self.public_y = public.y.to(self.device)
        self.public_table = None if public.table is None else public.table.to(self.device)

    def summary(self) -> dict[str, object]:
        hp = self.hp
        return {"eth": hp.sageflow_eth, "delta": hp.sageflow_delta, "lambda": hp.sageflow_lambda,
                "gamma": hp.sageflow_gamma, "gamma_halving": hp.sageflow_gamma_halving,
                "public_samples": len(self.public_y)}

    def gamma_at(self, rnd: int) -> float:
        return halved_gamma(self.hp.sageflow_gamma, self.hp.sageflow_gamma_halving, rnd)

    def score(self, params: torch.Tensor) -> tuple[float, float]:
        """(E_k, ℓ_k) of the model ``params`` on the public data."""
        logits = self.evaluator.map_batches(params, self.public_x, lambda net, x: net(x), self.public_table,
                                            batch_size=SCORE_BATCH)
        return public_scores(torch.cat(logits), self.public_y)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> int:
        """Returns how many uploads passed the entropy filter into the model."""
        now = package.round
        before = self.global_params
        groups: dict[int, list[tuple[ClientUpdate, float]]] = {}
        origins: dict[int, torch.Tensor] = {}  # start round -> the global model the group started from
        dropped, fresh = [], []  # (fresh: the uploads trained this round, filtered or not, for the diagnostics)
        for update in updates:
            start, origins[start] = update.origin(package)
            if start == now:
                fresh.append(update)
            entropy, loss = self.score(update.params)
            if entropy < self.hp.sageflow_eth:
                groups.setdefault(start, []).append((update, loss))
            else:
                dropped.append(update)
        self.record_filter([update for group in groups.values() for update, _ in group], dropped)
        if not groups:  # every upload filtered out: the global model stays
            if not self._said_all_filtered:  # from a random start this can last the whole run: say so once
                log.warning("warning: Sageflow round %d filtered out every upload (each one's mean prediction entropy "
                            "on the public data is >= --sageflow_eth %g), so the global model did not move; if this "
                            "persists, raise --sageflow_eth (the official code uses 2.5 for its backdoor runs; an "
                            "untrained 10-class model predicts near ln 10 = 2.3) or train more locally per round",
                            now, self.hp.sageflow_eth)
                self._said_all_filtered = True
            if self.hp.sageflow_diagnostics:
                self.record_diagnostics(fresh, package, before, [], origins)
            return 0
        starts = sorted(groups, reverse=True)  # the fresh group first
        averages, kept_samples = [], []
        for start in starts:
            kept = [update for update, _ in groups[start]]
            beta = loss_weights([u.num_samples for u in kept], [loss for _, loss in groups[start]],
                                self.hp.sageflow_delta)
            averages.append(weighted_average(kept, beta))
            kept_samples.append(float(sum(u.num_samples for u in kept)))
        alpha = group_weights(kept_samples, [now - start for start in starts], self.hp.sageflow_lambda)
        mixed = torch.zeros_like(averages[0])
        for average, weight in zip(averages, alpha):
            mixed.add_(average, alpha=float(weight))
        gamma = self.gamma_at(now)
        self.global_params = mixed if gamma == 1.0 else self.global_params * (1 - gamma) + mixed * gamma
        if self.hp.sageflow_diagnostics:
            self.record_diagnostics(fresh, package, before, list(zip(starts, alpha, averages)), origins)
        return sum(len(group) for group in groups.values())

    def record_diagnostics(self, fresh: list[ClientUpdate], package: RoundPackage, before: torch.Tensor,
                           mixture: list[tuple[int, float, torch.Tensor]], origins: dict[int, torch.Tensor]) -> None:
        """``--sageflow_diagnostics``: this round's step against ignoring's fresh-only step (module
        docstring); ``fresh``: this round's uploads trained from w_t, ``mixture``: (start round, α_τ, v_τ)
        of every kept group, ``before``: w_t."""
        now, series = package.round, self.history.add_series
        step = (self.global_params - before).double()
        stale = [(start, float(weight), average) for start, weight, average in mixture if start < now]
        stale_weight = sum(weight for _, weight, _ in stale)
        series("sageflow_stale_weight", stale_weight)
        series("sageflow_step_norm", float(step.norm()))
        nan = float("nan")
        fresh_only = weighted_average(fresh) if fresh else None
        fresh_step = None if fresh_only is None else (fresh_only - before).double()
        series("sageflow_fresh_step_norm", nan if fresh_step is None else float(fresh_step.norm()))
        series("sageflow_step_along_fresh",
               nan if fresh_step is None else float(step.dot(fresh_step) / fresh_step.dot(fresh_step)))
        pull = sum((weight / stale_weight * (origins[start] - before).double() for start, weight, _ in stale),
                   torch.zeros_like(step))
        progress = sum((weight / stale_weight * (average - origins[start]).double() for start, weight, average in stale),
                       torch.zeros_like(step))
        stale_step = pull + progress  # z_s − w_t
        has_both = bool(stale) and fresh_step is not None
        series("sageflow_stale_step_norm", float(stale_step.norm()) if stale else nan)
        series("sageflow_stale_pull_norm", float(pull.norm()) if stale else nan)
        series("sageflow_stale_progress_norm", float(progress.norm()) if stale else nan)
        series("sageflow_stale_fresh_cos", cosine(stale_step, fresh_step) if has_both else nan)
        series("sageflow_stale_progress_cos", cosine(progress, fresh_step) if has_both else nan)
        series("sageflow_next_acc", self.evaluate_models(lambda _: self.global_params, train_loss=False).test_acc)
        series("sageflow_fresh_only_acc", nan if fresh_only is None
               else self.evaluate_models(lambda _: fresh_only, train_loss=False).test_acc)

    def record_filter(self, kept: list[ClientUpdate], dropped: list[ClientUpdate]) -> None:
        """``rs_sageflow_filtered``, and where the uploads carry the attack's ground truth
        (``ClientUpdate.attacker``, with ``--attack``) the precision/recall of the filter."""
        history = self.history
        history.add_series("sageflow_filtered", len(dropped))
        if all(u.attacker is None for u in (*kept, *dropped)):
            return
        precision, recall = filter_precision_recall(kept, dropped)
        history.add_series("sageflow_precision", precision)
        history.add_series("sageflow_recall", recall)
