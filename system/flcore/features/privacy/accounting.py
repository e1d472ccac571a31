"""ε of the sampled Gaussian mechanism, from opacus's accountants (``--dp_accountant rdp|prv``).

opacus is imported only when a run uses differential privacy; where it is missing the run stops
with one line saying what to install. Everything here is a pure function of (σ, q, steps, δ):
what persists between rounds (each client's step count, the server's per-round sampling rates)
lives on the clients and the server, so a checkpoint carries it.

opacus's accountants keep ``history`` as a list of ``(noise_multiplier, sample_rate, steps)``,
the form their ``step`` builds one step at a time. The PRV accountant is handed that list. For
RDP, :func:`epsilon` does what ``RDPAccountant.get_privacy_spent`` does with it (Σ over the list
of opacus's ``compute_rdp(q, σ, steps)``, then its ``get_privacy_spent``) with one change of
order: ``compute_rdp`` is one step's RDP times ``steps``, and the one-step RDP of each (q, σ) is
computed once per run and kept, since its series over ~150 fractional orders takes about 0.1 s
(seconds on a loaded machine) and a run asks for ε every round. The arithmetic is opacus's, so the
result is the same float (``tests/privacy/test_dp.py`` checks it against ``RDPAccountant.step``
called step by step).
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Sequence

import numpy as np

from utils.errors import FLError

ACCOUNTANTS = ("rdp", "prv")


def accountant_class(name: str) -> type:
    """opacus's accountant class ``name`` (``rdp``: Mironov et al.'s RDP of the sampled Gaussian
    mechanism; ``prv``: Gopi et al.'s numerical composition of privacy random variables)."""
    try:
        from opacus.accountants import PRVAccountant, RDPAccountant
    except ImportError as exc:
        raise FLError(
            f"differential privacy needs opacus for its accountant ({exc}); install it with "
            "`pip install opacus==1.6.0` (keeps torch as it is)"
        ) from exc
    classes = {"rdp": RDPAccountant, "prv": PRVAccountant}
    if name not in classes:
        raise FLError(f"--dp_accountant {name!r}: use one of {', '.join(classes)}")
    return classes[name]


def compress(rates: Iterable[float]) -> list[tuple[float, int]]:
    """Runs of equal sampling rates as (rate, count), in order."""
    runs: list[tuple[float, int]] = []
    for rate in rates:
        if runs and runs[-1][0] == rate:
            runs[-1] = (rate, runs[-1][1] + 1)
        else:
            runs.append((rate, 1))
    return runs


def epsilon(accountant: str, sigma: float, steps: Sequence[tuple[float, int]], delta: float) -> float:
    """ε at ``delta`` after the steps ``[(q, count), ...]`` of the sampled Gaussian mechanism with
    noise multiplier ``sigma``. No step: 0; σ = 0 (no noise): ∞, without asking opacus."""
    steps = [(q, n) for q, n in steps if n > 0 and q > 0]
    if not steps:
        return 0.0
    if sigma <= 0:
        return math.inf
    instance = accountant_class(accountant)()
    if accountant == "rdp":
        from opacus.accountants.analysis import rdp as analysis

        orders = instance.DEFAULT_ALPHAS
        total = sum([one_step_rdp(float(sigma), float(q)) * int(n) for q, n in steps])
        eps, _ = analysis.get_privacy_spent(orders=orders, rdp=total, delta=float(delta))
        return float(eps)
    instance.history = [(float(sigma), float(q), int(n)) for q, n in steps]
    return float(instance.get_epsilon(delta=float(delta)))


@functools.lru_cache(maxsize=1024)
def one_step_rdp(sigma: float, q: float) -> np.ndarray:
    """opacus's RDP of one step of the sampled Gaussian mechanism at its default orders (cached)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    rdp = analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)
    rdp.flags.writeable = False  # shared by every caller
    return rdp


def worst_client_epsilon(accountant: str, sigma: float, delta: float, clients: Iterable[tuple[float, int]],
                         cache: dict | None = None) -> float:
    """The largest ε over clients given as (q, steps): each client's DP-SGD is its own mechanism on
    its own data, so the run guarantees the worst client's ε to every sample.

    ε grows with both q and the number of steps, so only clients that no other client exceeds in
    both are evaluated (the Pareto front), and ``cache`` keeps ε per (q, steps) across rounds."""
    pairs = sorted({(q, n) for q, n in clients if n > 0}, key=lambda p: (-p[0], -p[1]))
    front, most_steps = [], 0
    for q, n in pairs:  # by falling q: a client is on the front when it has more steps than all before
        if n > most_steps:
            front.append((q, n))
            most_steps = n
    worst = 0.0
    for key in front:
        value = cache.get(key) if cache is not None else None
        if value is None:
            value = epsilon(accountant, sigma, [key], delta)
            if cache is not None:
                cache[key] = value
        worst = max(worst, value)
    return worst
