"""Synthetic(alpha, beta) data of the FedProx paper (Li et al., MLSys 2020, arXiv:1812.06127).

For client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k ~ N(u_k, 1) (dim x classes),
b_k ~ N(u_k, 1); features x ~ N(v_k, Sigma) with v_k's entries ~ N(B_k, 1) and
Sigma diagonal, Sigma_jj = j^-1.2; label y = argmax(x W_k + b_k). alpha controls
how much the local models differ, beta how much the local features differ.
Client sizes follow the FedProx code: ``int(lognormal(4, 2)) + 50`` (the three constants are
the generator's ``--size-log-mean``, ``--size-log-std`` and ``--size-min``).

IID variant (paper: "same W, b on all devices and X_k following the same
distribution"): one W, b ~ N(0, 1) for all clients and v_k = 0.

Clients are drawn one after another (:func:`synthetic_clients` yields each as it is drawn), so a
population is written client by client without being held.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

#: FedProx's client sizes: int(lognormal(mean, sigma)) + minimum
SIZE_LOG_MEAN, SIZE_LOG_STD, SIZE_MIN = 4.0, 2.0, 50


def synthetic_sizes(num_clients: int, rng: np.random.Generator, *, log_mean: float = SIZE_LOG_MEAN,
                    log_std: float = SIZE_LOG_STD, minimum: int = SIZE_MIN) -> np.ndarray:
    """Samples per client (the first draws of the stream)."""
    return rng.lognormal(log_mean, log_std, num_clients).astype(np.int64) + minimum


def synthetic_clients(sizes: np.ndarray, alpha: float, beta: float, rng: np.random.Generator,
                      *, dim: int = 60, num_classes: int = 10,
                      iid: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each client's features (float32, [n_k, dim]) and labels (int64, [n_k]), in order; the
    caller may draw from ``rng`` between clients (the train/test split does)."""
    num_clients = len(sizes)
    mean_w = rng.normal(0, alpha, num_clients)
    feature_shift = rng.normal(0, beta, num_clients)
    std = np.arange(1, dim + 1, dtype=np.float64) ** (-1.2 / 2)
    w_global = rng.normal(0, 1, (dim, num_classes))
    b_global = rng.normal(0, 1, num_classes)
    for k in range(num_clients):
        if iid:
            w, b, mean_x = w_global, b_global, np.zeros(dim)
        else:
            w = rng.normal(mean_w[k], 1, (dim, num_classes))
            b = rng.normal(mean_w[k], 1, num_classes)
            mean_x = rng.normal(feature_shift[k], 1, dim)
        # Sigma is diagonal, so scaling independent normals samples N(mean_x, Sigma).
        x = mean_x + rng.standard_normal((int(sizes[k]), dim)) * std
        yield x.astype(np.float32), np.argmax(x @ w + b, axis=1).astype(np.int64)
