"""IGFL-client (Huang, Shang, Liu, Liu, "Behavior Mimics Distribution: Combining Individual and
Group Behaviors for Federated Learning", IJCAI 2021, Algorithm 2).

Each local step adds to the plain SGD step ΔI = −η·g a group correction built from the client's
own last upload Δw_i ("individual behaviour") and the server's last step Δw_ps ("group
behaviour")::

    ΔG = (1/|S|)·(ΔI − Δw_i/T) + Δw_ps/T,        w ← w + ΔI + ΔG

which is the base step ``w ← w − η·adjust_grad(w, g)`` with the direction

    g' = (1 + 1/|S|)·g + (Δw_i/(|S|·T) − Δw_ps/T)/η.

Choices (every one that changes numbers is a flag; defaults follow the paper's Algorithm 2):

* ``--igfl_c_denominator S`` (default): |S| = this round's cohort size before any drop-out, as in
  Algorithm 2 line 5; ``P`` uses the total number of clients, as in the derivation (Eq. 9).
* Δw_i is the client's *full* last upload (corrections included, Algorithm 2 line 8), zero before
  its first participation (Algorithm 1 "Δw_k^0 = 0") and stale while it is not selected (the
  paper leaves this open; its Sec. 5.4 remark confirms stale values under sampling). It lives in
  the shared ``ClientStateStore`` under ``igfl_delta`` (trainable parameters only) and is written
  by the server when the upload *arrives*: an upload lost to ``-cdr`` leaves it unchanged, so the
  client's memory and the server's copy used by time-attention never disagree.
* Δw_ps is the server's actual previous step (after attention if IGFL-S is on), 0 in round 0,
  broadcast in ``package.extras["igfl_server_step"]`` (trainable parameters only; it counts in the
  download bytes).
* T is this client's number of local steps this round (E·⌊n_i/B⌋ with PFLlib's drop_last), so it
  differs between clients of unequal size. A client with T = 0 takes no step and uploads a zero
  update, which then becomes its stored Δw_i.
* η is the client's current learning rate (``-lr``, decayed by ``-ld`` if set); the paper uses
  plain SGD without decay.
"""
from __future__ import annotations

from argparse import ArgumentParser

import torch

from flcore.clients.clientbase import Client
from flcore.protocol import RoundPackage
from cli.flags import add_flag

#: ClientStateStore name of each client's last upload Δw_i (trainable parameters only)
DELTA_KEY = "igfl_delta"
#: RoundPackage.extras key of the server's previous step Δw_ps (trainable parameters only)
SERVER_STEP_KEY = "igfl_server_step"


def igfl_terms(
    prev_delta: torch.Tensor | None, server_step: torch.Tensor, lr: float, steps: int, denominator: int
) -> tuple[float, torch.Tensor]:
    """(scale, offset) of the IGFL-C direction ``scale·g + offset`` for one client and round.

    ``scale = 1 + 1/|S|`` and ``offset = (Δw_i/(|S|·T) − Δw_ps/T)/η``; ``prev_delta=None`` means
    Δw_i = 0. With T = 0 no step is taken and the offset is zero."""
    if steps <= 0:
        return 1.0 + 1.0 / denominator, torch.zeros_like(server_step)
    offset = server_step / (-lr * steps)
    if prev_delta is not None:
        offset = offset + prev_delta.to(server_step.device, server_step.dtype) / (lr * steps * denominator)
    return 1.0 + 1.0 / denominator, offset


def igfl_direction(g: torch.Tensor, scale: torch.Tensor | float, offset: torch.Tensor) -> torch.Tensor:
    """The IGFL-C step direction ``scale·g + offset`` (pure; the step is ``w − η·direction``)."""
    return g * scale + offset


class IGFLClient(Client):
    """Local SGD with IGFL's individual/group correction in every step."""
    hooks_draw_no_rng = True  # begin_round: terms from the state store and the package

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--igfl_c_denominator", type=str, default="S", choices=["S", "P"],
                 help="the |S| of IGFL-C's correction: S = clients selected this round (Algorithm 2), "
                      "P = all clients (the derivation, Eq. 9)")

    def begin_round(self, package: RoundPackage, steps: int) -> dict[str, torch.Tensor]:
        if self.hp.igfl_c_denominator == "P":
            denominator = self.args.num_clients
        else:
            denominator = package.cohort_size
        server_step = package.extras[SERVER_STEP_KEY]
        prev = self.state.get(DELTA_KEY, self.index)
        scale, offset = igfl_terms(prev, server_step, self.learning_rate(), steps, denominator)
        return {"scale": torch.tensor(scale, dtype=server_step.dtype, device=server_step.device), "offset": offset}

    def adjust_grad(self, w: torch.Tensor, g: torch.Tensor, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
        return igfl_direction(g, ctx["scale"], ctx["offset"])
