"""FedPAC: feature alignment and classifier collaboration (Xu, Tong, Huang, ICLR 2023,
arXiv:2306.11867).

The body (feature extractor) is shared and averaged by samples; each client keeps a personal head.
Each round, from the uploads of its clients (``clientfedpac.py``), the server

* averages the bodies (FedAvg's rule; ``shared = "body"``);
* forms the global class centroids c_k = Σ_i n_{i,k} μ_{i,k} / Σ_i n_{i,k} over the uploaders
  holding class k (the paper's weighting; PFLlib takes the plain mean), sent with the next package;
* for each uploader i, solves the classifier-collaboration QP

      min_α  αᵀ (diag(V) + D_i) α   s.t.  α ≥ 0,  Σ_j α_j = 1,     D_i[j, l] = ⟨H_i − H_j, H_i − H_l⟩,

  over the round's uploaders j, l (V_j, H_j: their statistics), drops weights below 1e-3 (as the
  authors' code and PFLlib do) and renormalises the rest, and keeps Σ_j α_j · head_j as client
  i's head, sent in its next package (a per-client payload) and evaluated with the global body.

The QP is convex (P is a Gram matrix plus a non-negative diagonal), so its local solution is the
global one. It is solved in float64 by a primal active-set method on the simplex (``simplex_qp``:
exact, about 14x faster than SLSQP, whose iterations were a quarter of a 20-client round), with
scipy's SLSQP (``scipy.optimize.minimize``, exact gradient 2Pα) where P is singular. PFLlib imports
cvxpy for it (a large optional dependency) and clips P's negative eigenvalues, which here can only
be rounding.
A client whose QP fails keeps its own trained head, as in PFLlib. ``rs_fedpac_self_weight``
records the mean weight α_ii of each round.

Only personalised accuracy is recorded (the global body with the initial head is no model).
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from scipy.optimize import minimize

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedpac import FedPACClient
from flcore.common.labelmeans import LABELS, average, require_body_head
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from utils.errors import FLError

log = logging.getLogger("fl")

#: combination weights below this are dropped (the authors' code and PFLlib)
SMALL_WEIGHT = 1e-3


def simplex_qp(quadratic: np.ndarray) -> np.ndarray | None:
    """argmin aᵀPa over the probability simplex (a ≥ 0, Σa = 1) for a positive definite P, by the
    primal active-set method: from the uniform point, solve the equality-constrained problem on the
    free entries (a_F = P_FF⁻¹1 / 1ᵀP_FF⁻¹1), step towards it until an entry reaches 0 (it is fixed
    at 0), and free the fixed entry whose multiplier is negative until none is: the KKT point,
    exact up to rounding. None when a subproblem is singular (SLSQP then takes over)."""
    count = len(quadratic)
    a, fixed = np.full(count, 1.0 / count), np.zeros(count, dtype=bool)
    for _ in range(10 * count + 10):
        free = ~fixed
        try:
            direction = np.linalg.solve(quadratic[np.ix_(free, free)], np.ones(int(free.sum())))
        except np.linalg.LinAlgError:
            return None
        target = np.zeros(count)
        target[free] = direction / direction.sum()
        step = target - a
        shrinking = free & (step < -1e-15)
        if shrinking.any() and (target[shrinking] < 0).any():  # a free entry would turn negative
            ratios = a[shrinking] / -step[shrinking]
            blocking = np.flatnonzero(shrinking)[np.argmin(ratios)]
            a = np.clip(a + ratios.min() * step, 0.0, None)
            a[blocking], fixed[blocking] = 0.0, True
            continue
        a = target
        gradient = quadratic @ a  # half of it; the free entries share the value μ
        multipliers = gradient - gradient[free].mean()
        if not fixed.any() or multipliers[fixed].min() >= -1e-12 * max(abs(gradient[free].mean()), 1e-300):
            return a
        fixed[np.flatnonzero(fixed)[np.argmin(multipliers[fixed])]] = False
    return None


def collaboration_weights(variances: np.ndarray, statistics: np.ndarray, own: int) -> np.ndarray | None:
    """α for client ``own`` among the uploaders: the QP of the module docstring (None if no solver
    succeeds). The active-set solution (``simplex_qp``) is exact and took a fraction of SLSQP's time
    (SLSQP was a quarter of a FedPAC round with 20 clients on a CPU); SLSQP remains for a singular P.

    ``variances``: [U] V_j; ``statistics``: [U, C·d] the flattened H_j."""
    gaps = statistics[own][None, :] - statistics  # H_i − H_j, one row per j
    quadratic = np.diag(variances) + gaps @ gaps.T
    count = len(variances)
    x = simplex_qp(quadratic)
    if x is None:
        result = minimize(lambda a: a @ quadratic @ a, np.full(count, 1.0 / count), jac=lambda a: 2 * quadratic @ a,
                          method="SLSQP", bounds=[(0.0, 1.0)] * count,
                          constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones_like(a)}],
                          options={"ftol": 1e-12, "maxiter": 200})
        if not result.success:
            return None
        x = result.x
    alpha = np.where(x > SMALL_WEIGHT, x, 0.0)
    return alpha / alpha.sum()


@register_algorithm("FedPAC")
class FedPACServer(Server):
    #: what persists across rounds (checkpoints): the global feature centroids
    carried = ("centroids", "centroid_present")

    client_cls = FedPACClient
    personalized = True
    #: main.py warns when the model's body has no parameters (MLR): the features are the inputs
    learns_from_features = True
    has_global_model = False
    shared = "body"

    def setup(self) -> None:
        require_body_head(self.model.module, "FedPAC", self.args.model)
        if self.shared_mask is None:
            raise FLError(f"FedPAC needs a body and a head with parameters; -m {self.args.model} has no such split")
        if self.hp.lamda < 0:
            raise FLError(f"FedPAC needs -lam >= 0, got {self.hp.lamda}")
        self.head_mask = self.model.head_mask()
        self.centroids: torch.Tensor | None = None
        self.centroid_present: torch.Tensor | None = None

    def summary(self) -> dict[str, object]:
        return {"lamda": self.hp.lamda}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        extras = {}
        if self.centroids is not None:
            extras = {"centroids": self.centroids, "centroid_present": self.centroid_present}
        # copies: the store reuses its tensors when a head is set again
        payloads = {i: {"head": self.state.get("combined_head", i).clone()} for i in cohort
                    if self.state.has("combined_head", i)}
        return self.package(rnd, cohort, extras=extras, payloads=payloads)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        self.global_params = weighted_average(updates)
        sent = [u.extras for u in updates if u.extras[LABELS].numel()]
        if sent:
            self.centroids, self.centroid_present = average(sent, self.num_classes, sent[0]["means"].shape[1],
                                                            "samples", self.global_params)
        variances = np.array([float(u.extras["V"]) for u in updates])
        statistics = torch.stack([u.extras["H"].flatten() for u in updates]).double().cpu().numpy()
        heads = torch.stack([u.extras["head"] for u in updates]).double()
        self_weights = []
        for k, update in enumerate(updates):
            alpha = collaboration_weights(variances, statistics, k)
            if alpha is None:
                log.warning("warning: FedPAC's QP failed for client %d in round %d; it keeps its own head",
                            update.index, package.round)
                alpha = np.eye(len(updates))[k]
            self_weights.append(alpha[k])
            combined = torch.from_numpy(alpha).to(heads) @ heads
            self.state.set("combined_head", update.index, combined.to(self.global_params.dtype))
        self.history.add_series("fedpac_self_weight", float(np.mean(self_weights)))

    def eval_params(self, index: int) -> torch.Tensor:
        """The global body with the client's combined head (its own trained head, or the initial
        one, until it has one)."""
        params = super().eval_params(index)
        head = self.state.get("combined_head", index)
        if head is None:
            return params
        params = params.clone()
        params[self.head_mask] = head
        return params
