"""IGFL, IGFL-C and IGFL-S (Huang, Shang, Liu, Liu, "Behavior Mimics Distribution: Combining
Individual and Group Behaviors for Federated Learning", IJCAI 2021, Algorithms 1-3).

* ``IGFL-C``: IGFL's client rule (``clientigfl.py``) with the plain mean of the uploads.
* ``IGFL-S``: FedAvg's client with the attention-based server (Algorithm 3).
* ``IGFL``: both (Algorithm 1).

Algorithm 3 in aggregation-weight form: with uploads u_j = Δw_j^{r+1} (trainable parameters of
the uploaded model minus the global model) the server steps ``w ← w + Σ_j β_j u_j`` (server lr 1),
where β comes from an |S|×|S| Gram matrix computed in float64 (never |S| attended model copies):

* ``self``:   β_j = Σ_i p_i softmax_j(⟨u_i, u_j⟩)
* ``global``: β = softmax_j(⟨Σ_i p_i u_i, u_j⟩)
* ``time``:   logits Z_jτ = ⟨Δw_j^r, u_τ⟩ with Δw_j^r client j's previous upload (0 if none);
  ``diag`` β_j = softmax_τ(Z_j·)_j (the paper's Sec. 4.3 formula, Σβ ≠ 1 in general),
  ``matrix`` β_j = Σ_i p_i softmax_j(Z_i·)_j, ``vector`` β = softmax_j(Z_jj).

p are the base weights (1/|S| by default). Every softmax subtracts its maximum logit (exact).

Choices (each a flag; the default is the paper's rule where it has one):

* ``--attention time`` (default): the scheme of the paper's headline cross-silo results
  (Table 1, Algorithm 1 as evaluated) and of this platform's default full participation; it is
  also the only scheme whose first round is the plain mean. The paper itself picks per setting
  (``global`` for CIFAR-10 cross-device, ``self`` for EMNIST).
* ``--igfl_ta_mode diag`` (default): Algorithm 3/Sec. 4.3 read literally; ``matrix`` and ``vector``
  are normalised readings (Σβ = 1).
* ``--igfl_attn_temp 1.0`` and ``--igfl_sim dot`` (defaults = paper); any other temperature or
  cosine similarity is a deliberate deviation and is logged as one.
* ``--igfl_weighting uniform`` (default, paper's 1/|S|): the plain mean (IGFL-C), the global
  query and Algorithm 3 line 7 weigh clients equally; ``samples`` uses n_i/Σn (PFLlib's FedAvg
  form) there, with the attention weights unchanged. The plain mean without attention is exactly
  ``weighted_average`` with those weights, so IGFL-C's server with ``samples`` is FedAvg's.
* Attention sees trainable parameters only; float buffers (BatchNorm statistics) are averaged
  with the base weights p, never attended.
* Δw_ps broadcast to IGFL-C clients is the actual last server step (0 in round 0, and 0 after a
  round in which no upload arrived). Each arriving upload becomes its client's stored Δw_i
  (``ClientStateStore`` key ``igfl_delta``); clients not selected, or whose upload was dropped
  (``-cdr``), keep the stale value. Time-attention reads these values before overwriting them.

Recorded series: ``rs_igfl_weights`` (β of every aggregation, attention servers only).
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import ClassVar

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedavg import FedAvgClient
from flcore.clients.clientigfl import DELTA_KEY, SERVER_STEP_KEY, IGFLClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError

log = logging.getLogger("fl")

_GRAM_CHUNK = 1 << 20


def gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` in float64, accumulated over column chunks so only a slice is ever upcast."""
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[1], _GRAM_CHUNK):
        stop = start + _GRAM_CHUNK
        out += a[:, start:stop].double() @ b[:, start:stop].double().T
    return out


def stable_softmax(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(z − max z) / Σ exp(z − max z): exact, and never overflows."""
    e = torch.exp(z - z.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def _norms(g: torch.Tensor) -> torch.Tensor:
    return g.diagonal().clamp_min(0).sqrt().clamp_min(1e-30)


def attention_weights(
    updates: torch.Tensor,
    previous: torch.Tensor | None,
    scheme: str,
    ta_mode: str = "diag",
    temperature: float = 1.0,
    similarity: str = "dot",
    base: torch.Tensor | None = None,
) -> torch.Tensor:
    """IGFL-S aggregation weights β (float64, length |S|) of the uploads ``updates`` ([|S|, d]).

    ``previous`` ([|S|, d], zero rows for clients without one) is needed for ``time`` only;
    ``base`` are the clients' weights p in the mean and in Algorithm 3 line 7 (default 1/|S|)."""
    count = updates.shape[0]
    p = torch.full((count,), 1.0 / count, dtype=torch.float64, device=updates.device) if base is None else (
        base.to(updates.device, torch.float64)
    )
    g = gram(updates, updates)
    cos = similarity == "cos"
    if scheme == "self":
        logits = g / torch.outer(_norms(g), _norms(g)) if cos else g
        return p @ stable_softmax(logits / temperature, dim=1)
    if scheme == "global":
        logits = p @ g  # ⟨Σ_i p_i u_i, u_j⟩
        if cos:
            logits = logits / ((p @ g @ p).clamp_min(0).sqrt().clamp_min(1e-30) * _norms(g))
        return stable_softmax(logits / temperature, dim=0)
    if scheme != "time":
        raise FLError(f"unknown IGFL attention scheme {scheme!r} (self, global, time)")
    if previous is None:
        previous = torch.zeros_like(updates)
    logits = gram(previous, updates)  # Z[j, τ] = ⟨Δw_j^r, Δw_τ^{r+1}⟩
    if cos:
        prev_norms = gram(previous, previous).diagonal().clamp_min(0).sqrt().clamp_min(1e-30)
        logits = logits / torch.outer(prev_norms, _norms(g))
    logits = logits / temperature
    if ta_mode == "diag":
        return stable_softmax(logits, dim=1).diagonal().clone()
    if ta_mode == "matrix":
        return p @ stable_softmax(logits, dim=1)
    if ta_mode == "vector":
        return stable_softmax(logits.diagonal(), dim=0)
    raise FLError(f"unknown --igfl_ta_mode {ta_mode!r} (diag, matrix, vector)")


class IGFLBaseServer(Server):
    """Shared IGFL server: plain-mean or attention aggregation, Δw_ps broadcast, Δw_i store."""

    #: what persists across rounds (checkpoints): the server's step count
    carried = ("server_step",)

    #: broadcast Δw_ps for IGFL's client rule
    use_client_rule: ClassVar[bool] = False
    #: aggregate with Algorithm 3's attention instead of the plain mean
    use_attention: ClassVar[bool] = False

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--igfl_weighting", type=str, default="uniform", choices=["uniform", "samples"],
                 help="client weights p in IGFL's mean: uniform 1/|S| (paper) or n_i/sum n (PFLlib's FedAvg)")

    def setup(self) -> None:
        if self.args.num_clients is None:
            self.args.num_clients = len(self.clients)  # P, for --igfl_c_denominator P
        self.server_step = torch.zeros(self.model.num_params, dtype=self.global_params.dtype, device=self.device)

    def summary(self) -> dict[str, object]:
        keys = ("igfl_weighting", "igfl_c_denominator", "attention", "igfl_ta_mode", "igfl_attn_temp", "igfl_sim")
        return {k: getattr(self.hp, k) for k in keys if hasattr(self.hp, k)}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        extras = {SERVER_STEP_KEY: self.server_step} if self.use_client_rule else {}
        return self.package(rnd, cohort, extras=extras)

    def base_weights(self, updates: list[ClientUpdate]) -> torch.Tensor:
        """p: 1/|S| (uniform) or n_i/Σn (samples; uniform if no client has samples)."""
        count = len(updates)
        if self.hp.igfl_weighting == "samples":
            n = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
            if n.sum() > 0:
                return n / n.sum()
        return torch.full((count,), 1.0 / count, dtype=torch.float64)

    def stores_deltas(self) -> bool:
        return self.use_client_rule

    def step_weights(self, deltas: torch.Tensor, updates: list[ClientUpdate], base: torch.Tensor) -> torch.Tensor:
        """β of ``w ← w + Σ β_j Δw_j`` (the attention server overrides)."""
        return base

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        n = self.model.num_params
        old = self.global_params
        deltas = torch.stack([u.params[:n] - old[:n] for u in updates])
        base = self.base_weights(updates)
        if self.use_attention:
            beta = self.step_weights(deltas, updates, base)
            new = old.clone()
            new[:n] += beta.to(deltas.device, deltas.dtype) @ deltas
            if new.numel() > n:  # float buffers (BatchNorm statistics): the plain mean, never attended
                new[n:] = sum(weight * update.params[n:] for update, weight in zip(updates, base.tolist()))
            self.history.add_series("igfl_weights", beta.cpu().tolist())
        else:
            new = weighted_average(updates, base.tolist())
        self.server_step = new[:n] - old[:n]
        if self.stores_deltas():
            for update, delta in zip(updates, deltas):
                self.state.set(DELTA_KEY, update.index, delta)
        self.global_params = new

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        if not updates:  # nothing arrived: the model did not move
            self.server_step = torch.zeros_like(self.server_step)
        super().after_round(rnd, package, updates)


class IGFLAttentionServer(IGFLBaseServer):
    """Algorithm 3: the server step weighs the uploads by attention scores."""

    use_attention = True

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--attention", "--igfl_attention", dest="attention", type=str, default="time",
                 choices=["self", "global", "time"],
                 help="IGFL-S query: self (SA), global (GA, the mean update) or time (TA, previous uploads)")
        add_flag(parser, "--igfl_ta_mode", type=str, default="diag", choices=["diag", "matrix", "vector"],
                 help="time-attention weights: diag (paper, sum != 1), matrix or vector (normalised)")
        add_flag(parser, "--igfl_attn_temp", type=float, default=1.0, above=0,
                 help="softmax temperature of the attention logits (paper 1.0; other values deviate)")
        add_flag(parser, "--igfl_sim", type=str, default="dot", choices=["dot", "cos"],
                 help="similarity psi: dot product (paper) or cosine (deviation)")

    def setup(self) -> None:
        super().setup()
        if not self.hp.igfl_attn_temp > 0:
            raise FLError(f"--igfl_attn_temp must be > 0, got {self.hp.igfl_attn_temp}")
        if self.hp.igfl_attn_temp != 1.0 or self.hp.igfl_sim != "dot":
            log.warning(
                "IGFL-S: attention with temperature %g and %s similarity deliberately deviates from the paper "
                "(temperature 1, dot product)", self.hp.igfl_attn_temp, self.hp.igfl_sim,
            )

    def stores_deltas(self) -> bool:
        return self.use_client_rule or self.hp.attention == "time"

    def step_weights(self, deltas: torch.Tensor, updates: list[ClientUpdate], base: torch.Tensor) -> torch.Tensor:
        previous = None
        if self.hp.attention == "time":  # Δw_j^r: the stored last uploads, read before they are replaced
            previous = torch.zeros_like(deltas)
            for row, update in zip(previous, updates):
                stored = self.state.get(DELTA_KEY, update.index)
                if stored is not None:
                    row.copy_(stored)
        hp = self.hp
        return attention_weights(deltas, previous, hp.attention, hp.igfl_ta_mode, hp.igfl_attn_temp,
                                 hp.igfl_sim, base)


@register_algorithm("IGFL-C")
class IGFLCServer(IGFLBaseServer):
    client_cls = IGFLClient
    use_client_rule = True


@register_algorithm("IGFL-S")
class IGFLSServer(IGFLAttentionServer):
    client_cls = FedAvgClient


@register_algorithm("IGFL")
class IGFLServer(IGFLAttentionServer):
    client_cls = IGFLClient
    use_client_rule = True
