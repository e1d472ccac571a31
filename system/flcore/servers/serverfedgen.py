"""FedGen: data-free knowledge distillation with a server-side feature generator
(Zhu, Hong, Zhou, ICML 2021, arXiv:2105.10056).

The server learns a conditional generator G_w(z | y) of features (the head's input) so that the
uploaded clients' heads, as an ensemble, classify a generated feature as its label (Eq. 4):

    min_w  E_{y ~ p̂(y)} E_{z ~ G_w(·|y)}  CE( Σ_k α_k^y · h(z; θ_k), y ),

with α_k^y = n_k^y / Σ_j n_j^y, client k's share of the samples of label y among the uploaders,
and p̂(y) the label distribution of the uploaders (label counts are uploaded with the models).
Each round, after aggregating the models (FedAvg), the generator takes ``-se`` Adam steps (lr
``-glr``) on batches of ``-lbs`` labels drawn from p̂; its weights and p̂ are sent with the next
round's package, and each client adds ``--fedgen_alpha`` · CE(h(G(z|y)), y) on generated features
to its loss (Eq. 5, ``clientfedgen.py``).

The generator is [ε, onehot(y)] → Linear(``-hd``) → BatchNorm → ReLU → Linear(feature dim), as in
the authors' and PFLlib's code. Deliberate choices, where paper and PFLlib differ:
* ``--fedgen_noise normal`` (paper: ε ~ N(0, I)); ``uniform`` is PFLlib's ``torch.rand``.
* ``--fedgen_teacher label`` (the authors' code: per-label weights α_k^y); ``samples`` weights each
  head by its client's sample share, as PFLlib does.
* ``--fedgen_prior uploaders`` (paper: the label counts the round's uploaders sent); ``all`` uses
  every client's counts, as PFLlib does (which the server could not know in a real deployment).
* The generator's learning rate decays by ``-ldg`` per round only with ``-ld`` (PFLlib always
  decays it, which over 2,000 rounds at 0.99 turns the generator off).
* Clients run the generator in eval mode (BatchNorm running statistics from the server's
  training); PFLlib runs it in train mode on the client, where its statistics change per batch.
* The authors' diversity loss is not used (neither the paper's Eq. 4 nor PFLlib has it).
* Round 0 has no trained generator yet: clients train without the term then.
``-lf`` (``--localize_feature_extractor``, PFLlib) keeps the body private and shares the head.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from flcore.protocol import ClientUpdate, RoundPackage
from flcore.clients.clientfedgen import FedGenClient
from flcore.flat import FlatModel
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import derive_seed, torch_generator

log = logging.getLogger("fl")


class FeatureGenerator(nn.Module):
    """G(ε, y): a feature of the head's input size for label y."""

    def __init__(self, noise_dim: int, num_classes: int, hidden_dim: int, feature_dim: int, noise: str):
        super().__init__()
        self.noise_dim, self.num_classes, self.noise = noise_dim, num_classes, noise
        self.hidden = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU())
        self.out = nn.Linear(hidden_dim, feature_dim)

    def draw_noise(self, count: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        if self.noise == "normal":
            return torch.randn(count, self.noise_dim, generator=generator).to(device)
        return torch.rand(count, self.noise_dim, generator=generator).to(device)

    def forward(self, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(labels, self.num_classes).to(noise.dtype)
        return self.out(self.hidden(torch.cat([noise, onehot], dim=1)))


@register_algorithm("FedGen")
class FedGenServer(Server):
    #: what persists across rounds (checkpoints): the generator, its optimizer, whether it has trained, the label prior
    carried = ("generator", "optimizer", "trained_generator", "prior")

    client_cls = FedGenClient

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-nd", "--noise_dim", type=int, default=512, low=1, help="FedGen: generator noise dimension")
        add_flag(parser, "-glr", "--generator_learning_rate", type=float, default=0.005, above=0,
                 help="FedGen: Adam learning rate of the generator")
        add_flag(parser, "-hd", "--hidden_dim", type=int, default=512, low=1, help="FedGen: generator hidden width")
        add_flag(parser, "-se", "--server_epochs", type=int, default=1000, low=0,
                 help="FedGen: generator steps per round (PFLlib's default 1000)")
        add_flag(parser, "-lf", "--localize_feature_extractor", type=bool, default=False,
                 help="FedGen: keep the body private and share only the head (PFLlib)")
        add_flag(parser, "--fedgen_noise", type=str, default="normal", choices=["normal", "uniform"],
                 help="generator noise: N(0, I) (paper) or U[0, 1) (PFLlib)")
        add_flag(parser, "--fedgen_teacher", type=str, default="label", choices=["label", "samples"],
                 help="ensemble weights of the heads: per-label sample shares (authors' code) or sample shares (PFLlib)")
        add_flag(parser, "--fedgen_prior", type=str, default="uploaders", choices=["uploaders", "all"],
                 help="label distribution p̂(y): the round's uploaders' counts (paper) or every client's (PFLlib)")

    def shared_parts(self) -> str:
        return "head" if self.hp.localize_feature_extractor else "all"

    def setup(self) -> None:
        args, hp = self.args, self.hp
        for flag, value in (("-nd", hp.noise_dim), ("-hd", hp.hidden_dim)):
            if value < 1:
                raise FLError(f"{flag} must be >= 1, got {value}")
        if hp.server_epochs < 0 or hp.generator_learning_rate <= 0:
            raise FLError("-se must be >= 0 and -glr > 0")
        body = getattr(self.model.module, "body", None)
        if body is None or not isinstance(getattr(self.model.module, "head", None), nn.Module):
            raise FLError(f"FedGen needs a model split into body and head; {args.model} is not")
        feature_dim = self._feature_dim()
        torch.manual_seed(derive_seed(args.seed, "fedgen-init"))
        self.generator = FlatModel(
            FeatureGenerator(hp.noise_dim, self.num_classes, hp.hidden_dim, feature_dim, hp.fedgen_noise),
            self.device,
        )
        self.generator.module.eval()  # clients run it in eval mode; it trains in train mode on the server
        self.optimizer = torch.optim.Adam(self.generator.module.parameters(), lr=hp.generator_learning_rate)
        if hp.server_epochs == 0:
            log.warning("warning: FedGen with -se 0 never trains its generator: the clients' extra term is off (FedAvg)")
        self.trained_generator = False
        self.prior: torch.Tensor | None = None  # the label prior of the last aggregation
        self.label_counts = torch.stack([
            torch.bincount(c.data.train_y.cpu(), minlength=self.num_classes) for c in self.clients
        ]).double()
        for client in self.clients:
            client.configure(generator=self.generator)  # the architecture; its weights travel in the package

    def _feature_dim(self) -> int:
        x = self.dataset.sample_inputs(2).to(self.device)
        module = self.model.module
        was_training = module.training
        module.eval()
        with torch.no_grad():
            dim = module.body(x).shape[1]
        module.train(was_training)
        return int(dim)

    def summary(self) -> dict[str, object]:
        a = self.hp
        return {"noise_dim": a.noise_dim, "hidden_dim": a.hidden_dim, "server_epochs": a.server_epochs,
                "generator_lr": a.generator_learning_rate, "alpha": a.fedgen_alpha, "noise": a.fedgen_noise,
                "teacher": a.fedgen_teacher, "prior": a.fedgen_prior}

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        if not self.trained_generator:
            return self.package(rnd, cohort)
        return self.package(rnd, cohort, extras={"generator": self.generator.vector.detach().clone(),
                                                 "label_prior": self.prior})

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        self.global_params = weighted_average(updates)
        counts = torch.stack([u.extras["label_counts"] for u in updates]).double()
        everyone = self.label_counts.sum(0)
        self.prior = (counts.sum(0) if self.hp.fedgen_prior == "uploaders" else everyone).float()
        if self.hp.server_epochs:
            self.train_generator(package.round, updates, counts)

    def teacher_weights(self, updates: list[ClientUpdate], counts: torch.Tensor) -> torch.Tensor:
        """[K, C]: the weight of uploader k's head for label y."""
        if self.hp.fedgen_teacher == "label":
            per_label = counts.sum(0, keepdim=True)
            return torch.where(per_label > 0, counts / per_label.clamp_min(1), 0.0)
        samples = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
        return (samples / samples.sum()).unsqueeze(1).expand(-1, self.num_classes)

    def train_generator(self, rnd: int, updates: list[ClientUpdate], counts: torch.Tensor) -> None:
        """``-se`` Adam steps of the generator against the ensemble of the uploaded heads."""
        if float(self.prior.sum()) <= 0:
            return
        head = self.model.module.head
        prefix = "head."
        heads = {}
        for seg in self.model.segments:
            if seg.name.startswith(prefix) and seg.is_param:
                heads[seg.name[len(prefix):]] = torch.stack(
                    [u.params[seg.start : seg.stop].view(seg.shape) for u in updates]).detach()
        ensemble = vmap(lambda p, z: functional_call(head, p, (z,)), in_dims=(0, None))
        weights = self.teacher_weights(updates, counts).to(self.device, self.global_params.dtype)
        gen = self.generator.module
        gen.train()
        draw = torch_generator(self.args.seed, "fedgen-server", rnd)
        batch = int(self.args.batch_size)
        head_was_training = head.training
        head.eval()
        for _ in range(int(self.hp.server_epochs)):
            labels = torch.multinomial(self.prior.cpu(), batch, replacement=True, generator=draw).to(self.device)
            features = gen(gen.draw_noise(batch, draw, self.device), labels)
            logits = (ensemble(heads, features) * weights[:, labels].unsqueeze(-1)).sum(0)  # [B, C]
            loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        head.train(head_was_training)
        gen.eval()
        self.trained_generator = True
        self.history.add_series("fedgen_generator_loss", float(loss.detach()))
        if self.args.learning_rate_decay:
            for group in self.optimizer.param_groups:
                group["lr"] *= float(self.args.learning_rate_decay_gamma)
