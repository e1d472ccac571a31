"""FedACS: personalised FL with attention-based client selection (Chen, Li, Shen, arXiv:2312.15148).

The server keeps every client's latest model w_j (the model it uploaded the last time it trained;
the common initial model before that). In round k, for the pool of clients (``--fedacs_pool``:
the selected cohort P_k, Algorithm 1 lines 5-6, or all n clients) it computes

* the cosine similarity s_ij = ⟨w_i, w_j⟩ / (‖w_i‖‖w_j‖) of the flattened *trainable parameters*,
  in float64, clipped to [−1, 1], with s_ii = 1 exactly;
* the threshold δ = the p-quantile (linear interpolation, ``torch.quantile``) of all entries of S
  (``--fedacs_quantile_diag include``, the paper's "all elements") or of the off-diagonal entries
  only (``exclude``);
* Eq. 4 for each selected client i:  u_i = Σ_j 1[s_ij > δ] s_ij w_j / Σ_j 1[s_ij > δ] s_ij, with the
  strict ">" (ties at δ are dropped, which decides the §5 tie case in float64) and the diagonal
  always kept (the paper says s_ii "is always greater than δ"; with p = 1 the quantile is 1 and a
  strict ">" would drop it). A normaliser ≤ 1e-12 (possible only with negative similarities)
  falls back to u_i = w_i.
* ``--fedacs_alpha`` α generalises Eq. 3's step: u_i = (1 − α) w_i + α · Eq. 4 (α = 1, the paper).

Client i ∈ P_k trains from u_i (``clientfedacs.py``) and its upload becomes its latest model;
clients outside P_k keep theirs. Each client is evaluated with its latest model.

Deliberate choices (the paper does not say):
* BatchNorm-style float buffers are not "model parameters": they take no part in S or Eq. 4 and
  u_i keeps client i's own buffers.
* FedACS has no global model. For reporting (``rs_test_acc_global``) and ``--save_model`` the
  server's "global" model is the sample-weighted mean of every client's latest model (clients
  that never trained contribute the initial model).
* Per round the server records ``rs_fedacs_delta`` (δ) and ``rs_fedacs_kept`` (mean number of
  pool models, self included, that enter a u_i).

Reproduction: the paper's data-scarce Fashion-MNIST setting (100 clients, Dirichlet 0.5, 50
training samples each) is ``suites/fedacs_scarce.toml``, its page ``docs/results/fedacs_scarce.md``.
The paper gives neither p, the model, E nor the number of rounds; p = 0.5 is the default here.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.protocol import ClientUpdate, RoundPackage, sample_weights
from flcore.clients.clientfedacs import FedACSClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server
from cli.flags import add_flag
from utils.errors import FLError


def _column_chunks(width: int, rows: int) -> list[slice]:
    """Column blocks of a rows x width matrix small enough to convert to float64 one at a time."""
    step = max(1, (1 << 24) // max(rows, 1))
    return [slice(c, min(c + step, width)) for c in range(0, width, step)]


def cosine_matrix(params: torch.Tensor) -> torch.Tensor:
    """Cosine similarities of the rows of ``params`` in float64, in [−1, 1], diagonal exactly 1."""
    gram = torch.zeros(len(params), len(params), dtype=torch.float64, device=params.device)
    for cols in _column_chunks(params.shape[1], len(params)):
        block = params[:, cols].double()
        gram += block @ block.T
    norms = gram.diagonal().sqrt().clamp_min(1e-300)
    sim = (gram / (norms[:, None] * norms[None, :])).clamp(-1.0, 1.0)
    sim.fill_diagonal_(1.0)
    return sim


def mix(weights: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """``weights @ params`` accumulated in float64 (rows of weights: float64 mixing coefficients)."""
    out = torch.empty(len(weights), params.shape[1], dtype=torch.float64, device=params.device)
    for cols in _column_chunks(params.shape[1], len(params)):
        out[:, cols] = weights @ params[:, cols].double()
    return out


def quantile_threshold(sim: torch.Tensor, p: float, include_diagonal: bool = True) -> float:
    """δ = the p-quantile (linear interpolation) of the entries of ``sim``; +inf if there are none."""
    if include_diagonal:
        values = sim.reshape(-1)
    else:
        values = sim[~torch.eye(len(sim), dtype=torch.bool, device=sim.device)]
    if values.numel() == 0:
        return float("inf")
    return float(torch.quantile(values, p))


def attention_weights(sim: torch.Tensor, delta: float) -> torch.Tensor:
    """Rows of Eq. 4's weights: s_ij where s_ij > δ (diagonal always kept), normalised to sum 1."""
    keep = sim > delta
    keep.fill_diagonal_(True)
    weights = torch.where(keep, sim, torch.zeros_like(sim))
    total = weights.sum(dim=1, keepdim=True)
    eye = torch.eye(len(sim), dtype=sim.dtype, device=sim.device)
    ok = total > 1e-12
    return torch.where(ok, weights / torch.where(ok, total, torch.ones_like(total)), eye)


@register_algorithm("FedACS")
class FedACSServer(Server):
    client_cls = FedACSClient
    personalized = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--fedacs_p", type=float, default=0.5, low=0, high=1,
                 help="pick ratio p: δ is the p-quantile of the similarity matrix (not reported in the paper)")
        add_flag(parser, "--fedacs_pool", type=str, default="selected", choices=["selected", "all"],
                 help="clients whose latest models form S and enter Eq. 4: this round's cohort or all clients")
        add_flag(parser, "--fedacs_quantile_diag", type=str, default="include", choices=["include", "exclude"],
                 help="whether the diagonal (all ones) of S counts in the quantile (paper: all elements)")
        add_flag(parser, "--fedacs_alpha", type=float, default=1.0, low=0, high=1,
                 help="server step α: u_i = (1 − α) w_i + α · Eq. 4 (paper: 1)")

    def setup(self) -> None:
        if not 0.0 <= self.hp.fedacs_p <= 1.0:
            raise FLError(f"--fedacs_p must be in [0, 1], got {self.hp.fedacs_p}")
        if self.hp.fedacs_local_steps == 0 or self.hp.fedacs_local_steps < -1:
            raise FLError(f"--fedacs_local_steps must be -1 (E epochs) or > 0, got {self.hp.fedacs_local_steps}")
        self.init_params = self.global_params.clone()

    def summary(self) -> dict[str, object]:
        a = self.args
        return {"p": a.fedacs_p, "pool": a.fedacs_pool, "quantile_diag": a.fedacs_quantile_diag,
                "alpha": a.fedacs_alpha, "local_steps": a.fedacs_local_steps}

    def latest(self, index: int) -> torch.Tensor:
        """Client ``index``'s latest uploaded model (the initial model if it never trained)."""
        model = self.state.get("latest", index)
        return self.init_params if model is None else model

    def intermediate_models(self, cohort: list[int]) -> dict[int, torch.Tensor]:
        """Eq. 4 (with ``--fedacs_alpha``) for every client of ``cohort``."""
        pool = cohort if self.hp.fedacs_pool == "selected" else list(range(len(self.clients)))
        stacked = torch.stack([self.latest(j) for j in pool])
        num_params = self.model.num_params
        sim = cosine_matrix(stacked[:, :num_params])
        delta = quantile_threshold(sim, self.hp.fedacs_p, self.hp.fedacs_quantile_diag == "include")
        weights = attention_weights(sim, delta)
        position = {j: k for k, j in enumerate(pool)}
        rows = [position[i] for i in cohort]
        mixed = mix(weights[rows], stacked[:, :num_params])
        alpha = self.hp.fedacs_alpha
        out = {}
        for k, i in enumerate(cohort):
            own = stacked[rows[k]]
            u = own.clone()
            u[:num_params] = ((1 - alpha) * own[:num_params].double() + alpha * mixed[k]).to(own.dtype)
            out[i] = u
        self.history.add_series("fedacs_delta", delta)
        self.history.add_series("fedacs_kept", float((weights[rows] > 0).sum(dim=1).double().mean()))
        return out

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        """Each selected client receives its own intermediate model u_i (a per-client payload)."""
        return self.package(rnd, cohort, payloads={i: {"u": u} for i, u in self.intermediate_models(cohort).items()})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """Store each upload as its client's latest model; the reported global model is their
        sample-weighted mean over all clients."""
        for update in updates:
            self.state.set("latest", update.index, update.params)
        weights = sample_weights([c.num_train for c in self.clients])
        total = torch.zeros_like(self.global_params)
        for index, weight in enumerate(weights):
            total.add_(self.latest(index), alpha=float(weight))
        self.global_params = total

    def eval_params(self, index: int) -> torch.Tensor:
        return self.latest(index)
