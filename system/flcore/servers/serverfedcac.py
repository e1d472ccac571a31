"""FedCAC (Wu et al., ICCV 2023, arXiv:2309.11103): PFLlib's ``-algo FedCAC``.

After each round the server averages the uploaded models (sample-weighted, FedAvg) and builds for
each uploading client i a customised model: the plain mean of the uploads of i and of every
client j of the round whose critical masks overlap enough,

    o_ij = 1 − ‖m_i − m_j‖₁ / (2‖m_i‖₁),   j collaborates with i when o_ij ≥ ō + (t+1)/β·(o_max − ō),

ō and o_max being the mean and maximum of o_ij over the round's ordered pairs i ≠ j and t the
round: early on, clients collaborate widely on their critical parameters; after β rounds only the
most similar do. The customised model (state ``customized``) is sent to the client the next time
it is selected (a per-client payload); the client takes its critical parameters from it and the
rest from the global model (``clientfedcac.py``), and is evaluated with that same mixture (the
global model before its first mask). The global model's accuracy is recorded too.

Edge cases PFLlib leaves undefined: a round with one upload customises nothing (the customised
model is the client's own upload); a client without critical parameters has overlap 0.
``-bt`` is used as a real number (PFLlib truncates it to an integer and requires ≥ 1).
"""
from __future__ import annotations

import torch

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedcac import FedCACClient
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from utils.errors import FLError


def overlaps(masks: torch.Tensor) -> torch.Tensor:
    """o_ij = 1 − ‖m_i − m_j‖₁ / (2‖m_i‖₁) for the rows of ``masks`` (0 where ‖m_i‖₁ = 0)."""
    m = masks.double()
    counts = m.sum(dim=1)
    differing = counts[:, None] + counts[None, :] - 2.0 * (m @ m.T)
    out = 1.0 - differing / (2.0 * counts[:, None]).clamp_min(1.0)
    return torch.where(counts[:, None] > 0, out, torch.zeros_like(out))


@register_algorithm("FedCAC")
class FedCACServer(Server):
    client_cls = FedCACClient
    personalized = True

    def setup(self) -> None:
        if not 0 < self.hp.tau <= 1:
            raise FLError(f"FedCAC's -tau must lie in (0, 1], got {self.hp.tau}")
        if self.hp.beta <= 0:
            raise FLError(f"FedCAC's -bt must be > 0, got {self.hp.beta} (PFLlib requires an integer >= 1)")
        bounds = [seg.start for seg in self.model.param_segments()] + [self.model.num_params]
        #: where each parameter tensor starts in the flat vector (the critical masks are per tensor)
        self.segment_bounds = torch.tensor(bounds, dtype=torch.long)

    def summary(self) -> dict[str, object]:
        return {"tau": self.hp.tau, "beta": self.hp.beta}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        payloads = {i: {"customized": model.clone()} for i in cohort
                    if (model := self.state.get("customized", i)) is not None}
        return self.package(rnd, cohort, extras={"cac_segments": self.segment_bounds}, payloads=payloads)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        self.global_params = weighted_average(updates)
        if len(updates) == 1:
            self.state.set("customized", updates[0].index, updates[0].params)
            return
        o = overlaps(torch.stack([u.extras["critical"] for u in updates]))
        off_diagonal = ~torch.eye(len(updates), dtype=torch.bool)
        mean, top = o[off_diagonal].mean(), o[off_diagonal].max()
        threshold = mean + (package.round + 1) / self.hp.beta * (top - mean)
        for k, update in enumerate(updates):
            partners = [u for j, u in enumerate(updates) if j == k or o[k, j] >= threshold]
            mean = weighted_average(partners, [1.0 / len(partners)] * len(partners))
            self.state.set("customized", update.index, mean)

    def eval_params(self, index: int) -> torch.Tensor:
        mask, customized = self.state.get("cac_mask", index), self.state.get("customized", index)
        if mask is None or customized is None:
            return self.global_params
        params = self.global_params.clone()
        params[: mask.shape[0]][mask] = customized[: mask.shape[0]][mask]
        return params
