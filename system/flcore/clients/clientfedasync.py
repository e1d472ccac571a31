"""FedAsync client (Xie, Koyejo & Gupta 2019, arXiv:1903.03934, Algorithm 1, the worker).

A worker that received the global model x_τ minimises the regularised objective

    g_{x_τ}(x; z) = f(x; z) + ρ/2 · ‖x − x_τ‖²

with local SGD, so every minibatch step is w ← w − γ · (∇f(w; z) + ρ · (w − x_τ)): FedProx's
proximal step (:class:`~flcore.clients.clientfedprox.ProximalClient`) with ρ for μ. x_τ is the
global model the upload started from (a straggler's is its start round's, which the round package
it trained on carries). ρ = ``--async_rho``; the default 0.005 is the paper's CIFAR-10 value (its
WikiText-2 runs use 0.0001), and ρ = 0 is FedAvg's local step, step for step.

Units: the authors' code (xcgoner/async_fl) takes γ·ρ, not ρ (its ``--rho`` is "regularization ×
lr", applied as w ← (1 − γρ)·w + γρ·x_τ before each SGD step), and its ``experiment_script_1.sh``
runs ``--rho 0.01`` at lr 0.1: ρ = 0.1 in the paper's units used here (``--async_rho 0.1``).
"""
from __future__ import annotations

from argparse import ArgumentParser

from flcore.clients.clientfedprox import ProximalClient
from cli.flags import add_flag

#: ρ of the paper's CIFAR-10 experiments
PAPER_RHO = 0.005


class FedAsyncClient(ProximalClient):
    """Local SGD on the paper's regularised objective (module docstring)."""

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--async_rho", type=float, default=PAPER_RHO, low=0,
                 help="FedAsync: weight rho of the workers' regulariser rho/2 ||x - x_tau||^2 (the paper's CIFAR-10 "
                      "value 0.005; 0: plain local SGD)")

    def proximal_coefficient(self) -> float:
        return self.hp.async_rho
