"""FedGH client (Yi et al., ACM MM 2023, arXiv:2305.13137).

The client trains its whole model (its own body with the global head the server sent, which
replaces its head every round) by plain SGD on cross-entropy. After training, it computes its
local averaged representation of each class it holds, R_i^s = the mean body output of its class-s
samples under the trained model (eval mode, one extra forward pass over its training data, as in
the paper and PFLlib), and uploads these with their labels; its model weights never leave it.

The extra pass is the client's ``post_training`` (it gets the trained working model), so the
base training sequence stays and every engine (threaded, batched) trains these clients.
"""
from __future__ import annotations

from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, LocalJob
from flcore.common.labelmeans import body_class_sums, upload
from flcore.flat import FlatModel


class FedGHClient(Client):
    """FedAvg's local SGD, then the per-class mean representations of the trained model."""
    uploads_instead = "per-class mean representations"

    def post_training(self, job: LocalJob, model: FlatModel) -> None:
        job.ctx["class_sums"], job.ctx["class_seen"] = body_class_sums(self, model)

    def end_round(self, params, package, ctx, steps, loss) -> ClientUpdate:
        sent = upload(ctx["class_sums"], ctx["class_seen"]) if "class_sums" in ctx else {}
        return ClientUpdate(self.index, self.num_train, steps, params, loss, extras=sent, uploads_params=False)
