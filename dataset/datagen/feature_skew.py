"""Generic feature shift on any image dataset: ``--feature-skew rotation|noise|jitter``.

Each client gets its own transformation, applied to all its images (training
and test parts alike, so a client's test data come from its own domain). The
parameters and the noise are drawn from a generator seeded with
``(seed, FEATURE_SKEW_STREAM, client)``, so a client's domain does not depend on
how many clients there are or on the order they are written in.

* ``rotation``: every client rotates its images by one angle drawn uniformly
  from ``[-strength, strength]`` degrees (default 180), bilinear, background
  filled with black.
* ``noise``: Gaussian noise with client-specific standard deviation
  ``strength * (c + 1) / num_clients`` in the normalised [-1, 1] space
  (NIID-Bench's noise-based feature imbalance, ``sigma * i / N``; default
  strength 0.5), drawn independently per pixel, not clipped.
* ``jitter``: colour jitter with client-specific brightness, contrast and (for
  3 channels) saturation factors, each uniform in ``[1 - s, 1 + s]`` (default
  s = 0.5), applied in [0, 1] pixel space and clipped there, as torchvision's
  ColorJitter does with one fixed draw per client.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import DatasetError

FEATURE_SKEW_STREAM = 0xFEA7
DEFAULT_STRENGTH = {"rotation": 180.0, "noise": 0.5, "jitter": 0.5}
FEATURE_SKEWS = tuple(DEFAULT_STRENGTH)


def client_rng(seed: int, client: int) -> np.random.Generator:
    """The generator of client ``client``'s feature shift."""
    return np.random.default_rng([seed, FEATURE_SKEW_STREAM, client])


def _rotation(x: np.ndarray, strength: float, client: int, num_clients: int,
              rng: np.random.Generator) -> tuple[np.ndarray, float]:
    from scipy.ndimage import rotate

    angle = float(rng.uniform(-strength, strength))
    if len(x) == 0:
        return x, angle
    turned = rotate(x, angle, axes=(-1, -2), reshape=False, order=1, mode="constant", cval=-1.0)
    return turned.astype(np.float32, copy=False), angle


def _noise(x: np.ndarray, strength: float, client: int, num_clients: int,
           rng: np.random.Generator) -> tuple[np.ndarray, float]:
    sigma = strength * (client + 1) / num_clients
    noisy = x + rng.normal(0.0, sigma, size=x.shape).astype(np.float32)
    return noisy.astype(np.float32, copy=False), sigma


def _jitter(x: np.ndarray, strength: float, client: int, num_clients: int,
            rng: np.random.Generator) -> tuple[np.ndarray, float]:
    brightness, contrast, saturation = rng.uniform(1 - strength, 1 + strength, size=3)
    img = (x + 1.0) / 2.0  # back to [0, 1] pixels
    img = np.clip(img * brightness, 0, 1)
    gray = img.mean(axis=1, keepdims=True) if img.shape[1] == 1 else \
        (0.299 * img[:, :1] + 0.587 * img[:, 1:2] + 0.114 * img[:, 2:3])
    img = np.clip((img - gray.mean(axis=(1, 2, 3), keepdims=True)) * contrast
                  + gray.mean(axis=(1, 2, 3), keepdims=True), 0, 1)
    if img.shape[1] == 3:
        gray = 0.299 * img[:, :1] + 0.587 * img[:, 1:2] + 0.114 * img[:, 2:3]
        img = np.clip(gray + (img - gray) * saturation, 0, 1)
    # The picture shows one number per client: the brightness factor.
    return (img * 2.0 - 1.0).astype(np.float32), float(brightness)


SKEW_FUNCTIONS: dict[str, Callable[..., tuple[np.ndarray, float]]] = {
    "rotation": _rotation, "noise": _noise, "jitter": _jitter,
}
PARAMETER_NAMES = {"rotation": "angle (degrees)", "noise": "noise std", "jitter": "brightness"}


def check(kind: str | None, strength: float | None, input_shape: tuple[int, ...],
          is_image: bool) -> float | None:
    """Validate the options; returns the strength to use (the kind's default if None)."""
    if kind is None:
        if strength is not None:
            raise DatasetError("--skew-strength needs --feature-skew")
        return None
    if kind not in SKEW_FUNCTIONS:
        raise DatasetError(f"unknown --feature-skew {kind!r}; choose {', '.join(FEATURE_SKEWS)}")
    if not is_image or len(input_shape) != 3:
        raise DatasetError(f"--feature-skew {kind} needs an image dataset (channels x height x "
                           f"width), this one has inputs of shape {list(input_shape)}")
    value = DEFAULT_STRENGTH[kind] if strength is None else float(strength)
    if not (np.isfinite(value) and value >= 0) or (kind == "jitter" and value >= 1):
        raise DatasetError(f"--skew-strength for {kind} must be >= 0"
                           f"{' and < 1' if kind == 'jitter' else ''}, got {value}")
    return value


def apply(kind: str, x: np.ndarray, strength: float, client: int, num_clients: int,
          seed: int) -> tuple[np.ndarray, float]:
    """Client ``client``'s shifted images (float32, normalised) and its skew parameter."""
    return SKEW_FUNCTIONS[kind](x, strength, client, num_clients, client_rng(seed, client))
