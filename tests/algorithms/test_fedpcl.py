"""FedPCL: the prototype contrastive loss by hand, the prototype classifier as evaluated, the
uploaded normalised class means and their bytes, round 0 without training, bad input."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fltest import random_dataset, run_round
from fltest import one_thread  # noqa: F401  (fixture: importing it switches it on here)
from knowledgetest import HIDDEN, HiddenBody, hand_forward, hidden_server, per_class_sums, refusal

C, DIM, TAU = 3, 2, 0.5


def test_contrastive_loss_by_hand():
    data = random_dataset(num_clients=4, dim=DIM, num_classes=C, sizes=[6, 8, 5, 7], seed=3)
    server = hidden_server("FedPCL", data, "-tau", str(TAU))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, DIM, generator=g), torch.tensor([0, 1, 2, 0, 2, 1])
    global_protos = torch.randn(C, HIDDEN, generator=g)
    present = torch.tensor([True, True, False])  # class 2 has no prototype: its samples are left out
    uploaders = torch.randn(2, C, HIDDEN, generator=g)
    held = torch.tensor([[True, False, True], [True, True, True]])
    package = server.package(1, [0], extras={"global_prototypes": global_protos, "global_present": present,
                                             "client_prototypes": uploaders, "client_held": held,
                                             "num_clients": torch.tensor([4])})
    ctx = server.clients[0].begin_round(package, 1)
    flat = server.model
    flat.load(server.global_params)
    flat.zero_grad()
    loss = server.clients[0].local_loss(flat.net, x, y, ctx)
    loss.backward()

    w = server.global_params.double().requires_grad_(True)
    r = F.normalize(hand_forward(w, x.double(), C)[0], dim=1)

    def ce(prototypes):  # mean over the kept samples of CE over the classes with a prototype
        terms = []
        for row, label in zip(r, y.tolist()):
            if not present[label]:
                continue
            logits = torch.stack([row @ prototypes[k].double() / TAU for k in range(C) if present[k]])
            index = [k for k in range(C) if present[k]].index(label)
            terms.append(-torch.log_softmax(logits, 0)[index])
        return torch.stack(terms).mean()

    padded = [torch.stack([uploaders[j, k] if held[j, k] else global_protos[k] for k in range(C)]) for j in range(2)]
    expected = ce(global_protos) + (ce(padded[0]) + ce(padded[1]) + 2 * ce(global_protos)) / 4
    (grad,) = torch.autograd.grad(expected, w)
    assert abs(float(loss.detach()) - float(expected.detach())) < 1e-5
    assert torch.allclose(flat.grad.double(), grad, atol=1e-5)


def test_rounds_prototypes_and_the_prototype_classifier():
    data = random_dataset(num_clients=3, dim=DIM, num_classes=C, sizes=[9, 12, 10], seed=5)
    server = hidden_server("FedPCL", data, batch_size=4)
    initial = server.global_params.clone()
    first = run_round(server, 0)
    assert first.package.total_nbytes() == 0
    for k, update in enumerate(first.updates):
        assert torch.equal(server.state.get("private", k), initial)  # round 0: prototypes only, no training
        sums, seen = per_class_sums(F.normalize(hand_forward(initial.double(), data.clients[k].train_x.double(), C)[0],
                                                dim=1), data.clients[k].train_y, C)
        labels = torch.nonzero(seen > 0).flatten()
        assert torch.equal(update.extras["labels"], labels)
        assert torch.allclose(update.extras["means"].double(), sums[labels] / seen[labels].unsqueeze(1), atol=1e-6)
        assert not update.uploads_params and update.nbytes() == len(labels) * (8 + HIDDEN * 4)
    second = run_round(server, 1, cohort=[0, 1])
    assert second.package.extras["client_prototypes"].shape == (3, C, HIDDEN)
    assert not torch.equal(server.state.get("private", 0), initial)  # now it trains
    # evaluation: the class whose own prototype has the largest dot product with r̂ (rows without a prototype: 0)
    for k, client in enumerate(data.clients):
        own = server.state.get("prototypes", k).double()
        model = server.state.get("private", k).double()
        r = F.normalize(hand_forward(model, client.test_x.double(), C)[0], dim=1)
        expected = (r @ own.T).argmax(1)
        logits = hand_forward(server.eval_params(k).double(), client.test_x.double(), C)[1]
        assert torch.equal(logits.argmax(1), expected)


def test_bad_input():
    assert "body (features) and head (classifier)" in refusal("FedPCL", module=nn.Linear(3, 2))
    assert "-tau" in refusal("FedPCL", "-tau", "0", module=HiddenBody(3, 2))
    assert "body has no parameters" in refusal("FedPCL")  # the tests' linear model: an identity body

    class DeepHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(3, 4)
            self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

        def forward(self, x):
            return self.head(self.body(x))
    assert "nn.Linear" in refusal("FedPCL", module=DeepHead())
