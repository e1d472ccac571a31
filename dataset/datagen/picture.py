"""The partition picture (``<out>/partition.png``) and the short partition summary.

Up to :data:`BAR_LIMIT` clients the picture is one stacked bar per client
(samples per class); with more clients it is a clients x classes heatmap of
sample counts. For feature shift a strip beside the clients shows each
client's domain: a colour per domain name (Digit5, DomainNet) or a colour scale
for a numeric skew parameter (``--feature-skew``: angle, noise level, jitter).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

BAR_LIMIT = 50
#: classes drawn at most; more (StackOverflow's 10,004 ids; every other dataset has fewer) are
#: summed in bins of consecutive classes, at most PICTURE_CLASSES in a heatmap and BAR_SEGMENTS in
#: a bar, which keeps the drawing's memory and time in bounds
PICTURE_CLASSES = 2048
BAR_SEGMENTS = 128
#: label shares (clients x classes) the summary computes at a time: 32 MB of float64 a block,
#: 419,430 clients of 10 classes, 419 of StackOverflow's 10,004
SUMMARY_ENTRIES = 1 << 22


def label_bincount(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Samples per class of one label array: ``[rows]`` one class a sample, or ``[rows, T]``
    multi-label rows right-padded with -1, of which each label counts once and -1 not at all."""
    y = np.asarray(y)
    if y.ndim == 2:
        y = y[y >= 0]
    return np.bincount(y, minlength=num_classes)[:num_classes]


def count_matrix(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Samples per (client, class)."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]) \
        if len(parts) else np.zeros((0, num_classes), dtype=np.int64)


@dataclass
class Population:
    """What the summary says of a population whose label counts are not all held: every client's
    size, the classes per client (min, mean, max), every class's count and, when it could be
    computed from all clients (:func:`label_skew`), the mean label skew."""

    sizes: np.ndarray
    held: tuple[int, float, int]
    class_totals: np.ndarray
    skew: float | None = None


def label_skew(blocks: Iterable[np.ndarray], class_totals: np.ndarray) -> tuple[float, int]:
    """(mean, clients) of the total-variation distance of each client's label distribution from
    the global one, over ``[clients, classes]`` count blocks: 0 for IID clients, near 1 for clients
    holding classes that are rare overall."""
    overall = class_totals / max(class_totals.sum(), 1)
    total, clients = 0.0, 0
    for counts in blocks:
        local = np.maximum(counts.sum(axis=1), 1)[:, None]
        total += float((0.5 * np.abs(counts / local - overall).sum(axis=1)).sum())
        clients += len(counts)
    return total / max(clients, 1), clients


def summary_lines(counts: np.ndarray, domains: Sequence[object] | None = None, *,
                  totals: Population | None = None, sizes: np.ndarray | None = None,
                  multilabel: bool = False) -> list[str]:
    """A few lines describing sizes, classes per client and label skew.

    ``totals`` is given when ``counts`` holds only the first clients' rows; the label skew is then
    theirs unless ``totals`` has that of all clients. ``multilabel``: ``counts`` count label
    occurrences, not samples, and the samples per client are ``sizes`` (or ``totals.sizes``)."""
    if totals is None:
        held = (counts > 0).sum(axis=1)
        totals = Population(counts.sum(axis=1) if sizes is None else np.asarray(sizes),
                            (int(held.min()), float(held.mean()), int(held.max())), counts.sum(axis=0))
    sizes, held, class_totals = totals.sizes, totals.held, totals.class_totals
    if totals.skew is not None:
        skew, over = totals.skew, len(sizes)
    else:  # in blocks of clients, so a population's float copies never exist at once
        block = max(1, SUMMARY_ENTRIES // max(counts.shape[1], 1))
        skew, over = label_skew((counts[i:i + block] for i in range(0, len(counts), block)), class_totals)
    samples = f"{int(sizes.sum())} samples ({int(class_totals.sum())} labels)" if multilabel else \
        f"{int(class_totals.sum())} samples"
    lines = [
        f"Partition summary: {len(sizes)} clients, {samples}, {len(class_totals)} classes",
        f"  samples per client: min {int(sizes.min())}, median {int(np.median(sizes))}, "
        f"max {int(sizes.max())}",
        f"  classes per client: min {held[0]}, mean {held[1]:.1f}, max {held[2]}",
        f"  label skew (total variation from the global label mix, 0 = IID): mean {skew:.3f}"
        + (f" over the first {over} clients" if over < len(sizes) else ""),
    ]
    if domains is not None:
        values = list(domains)
        if all(isinstance(v, str) for v in values):
            names, per = np.unique(np.array(values), return_counts=True)
            lines.append("  domains: " + ", ".join(f"{n} ({c} clients)" for n, c in zip(names, per)))
        else:
            v = np.asarray(values, dtype=float)
            lines.append(f"  feature skew per client: min {v.min():.3g}, max {v.max():.3g}")
    return lines


def save_partition_png(path: Path, counts: np.ndarray, class_names: Sequence[str], *,
                       title: str, domains: Sequence[object] | None = None,
                       domain_label: str = "domain", unit: str = "samples") -> Path:
    """Draw the partition to ``path`` (written to a temporary name, then renamed); ``counts`` are
    ``unit`` (``labels`` for multi-label data, whose samples hold several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    num_clients, num_classes = counts.shape
    per = 1 if num_classes <= PICTURE_CLASSES else \
        -(-num_classes // (PICTURE_CLASSES if num_clients > BAR_LIMIT else BAR_SEGMENTS))
    if per > 1:
        counts = np.add.reduceat(counts, np.arange(0, num_classes, per), axis=1)
        num_classes = counts.shape[1]
    class_label = "class" if per == 1 else f"class (bins of {per} consecutive classes)"
    height = min(max(3.0, 0.22 * num_clients + 1.5), 14.0) if num_clients <= BAR_LIMIT else 8.0
    width_ratios = [1, 18] if domains is not None else [18]
    fig, axes = plt.subplots(1, len(width_ratios), figsize=(10, height), squeeze=False,
                             gridspec_kw={"width_ratios": width_ratios, "wspace": 0.03})
    ax = axes[0, -1]
    if num_clients <= BAR_LIMIT:
        cmap = plt.get_cmap("tab20" if num_classes <= 20 else "turbo", num_classes)
        left = np.zeros(num_clients)
        for k in range(num_classes):
            ax.barh(np.arange(num_clients), counts[:, k], left=left, color=cmap(k), height=0.85,
                    label=str(class_names[k]) if num_classes <= 20 else None)
            left += counts[:, k]
        ax.set_xlabel(f"{unit} (colour = {class_label})")
        ax.set_ylim(num_clients - 0.5, -0.5)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if num_classes <= 20:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, title="class")
    else:
        image = ax.imshow(np.log1p(counts), aspect="auto", interpolation="nearest", cmap="viridis")
        ax.set_xlabel(class_label)
        fig.colorbar(image, ax=ax, label=f"log(1 + {unit})", fraction=0.04)
    ax.set_title(title, fontsize=10)
    if domains is None:
        ax.set_ylabel("client")
    else:
        ax.set_yticks([])
        strip = axes[0, 0]
        values = list(domains)
        if all(isinstance(v, str) for v in values):
            names = sorted(set(values))
            codes = np.array([names.index(v) for v in values])[:, None]
            dmap = plt.get_cmap("Set2", max(len(names), 2))
            strip.imshow(codes, aspect="auto", cmap=dmap, vmin=0, vmax=max(len(names), 2) - 1,
                         interpolation="nearest")
            handles = [matplotlib.patches.Patch(color=dmap(i), label=n) for i, n in enumerate(names)]
            fig.legend(handles=handles, loc="lower left", fontsize=7, title=domain_label)
        else:
            image = strip.imshow(np.asarray(values, dtype=float)[:, None], aspect="auto",
                                 cmap="magma", interpolation="nearest")
            fig.colorbar(image, ax=axes[0, :], location="left", label=domain_label,
                         fraction=0.03, pad=0.08)
        strip.set_xticks([])
        strip.set_ylabel("client")
        strip.set_title(domain_label, fontsize=8)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path
