"""Synthetic(alpha, beta) data of the FedProx paper (Li et al., MLSys 2020, arXiv:1812.06127).

For client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k ~ N(u_k, 1) (dim x classes),
b_k ~ N(u_k, 1); features x ~ N(v_k, Sigma) with v_k's entries ~ N(B_k, 1) and
Sigma diagonal, Sigma_jj = j^-1.2; label y = argmax(x W_k + b_k). alpha controls
how much the local models differ, beta how much the local features differ.
Client sizes follow the FedProx code: ``int(lognormal(4, 2)) + 50``.

IID variant (paper: "same W, b on all devices and X_k following the same
distribution"): one W, b ~ N(0, 1) for all clients and v_k = 0.
"""

from __future__ import annotations

import numpy as np


def generate_synthetic(num_clients: int, alpha: float, beta: float, rng: np.random.Generator,
                       *, dim: int = 60, num_classes: int = 10,
                       iid: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-client features (float32, [n_k, dim]) and labels (int64, [n_k])."""
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + 50
    mean_w = rng.normal(0, alpha, num_clients)
    feature_shift = rng.normal(0, beta, num_clients)
    std = np.arange(1, dim + 1, dtype=np.float64) ** (-1.2 / 2)
    w_global = rng.normal(0, 1, (dim, num_classes))
    b_global = rng.normal(0, 1, num_classes)
    xs, ys = [], []
    for k in range(num_clients):
        if iid:
            w, b, mean_x = w_global, b_global, np.zeros(dim)
        else:
            w = rng.normal(mean_w[k], 1, (dim, num_classes))
            b = rng.normal(mean_w[k], 1, num_classes)
            mean_x = rng.normal(feature_shift[k], 1, dim)
        # Sigma is diagonal, so scaling independent normals samples N(mean_x, Sigma).
        x = mean_x + rng.standard_normal((int(sizes[k]), dim)) * std
        ys.append(np.argmax(x @ w + b, axis=1).astype(np.int64))
        xs.append(x.astype(np.float32))
    return xs, ys
