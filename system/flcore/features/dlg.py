"""Deep Leakage from Gradients (``-dlg``): the server reconstructs a client's training inputs from
what the client uploads, and the run records how well it succeeded.

DLG (Zhu, Liu, Han, NeurIPS 2019) optimises dummy inputs (and soft dummy labels) with L-BFGS so
that the gradient they produce on the model matches the observed one. iDLG (Zhao, Mopuri, Bilen
2020) first reads the label of a single-sample batch off the gradient of the classifier's bias
(``p - onehot(y)``: the true label's entry is the only negative one; without a bias, the row of
the last weight whose sum is negative, as the features feeding it are non-negative), and then
optimises the inputs only, which converges more reliably.

What is attacked (:class:`DLGAttack`, a round plug-in that observes each round)
-------------------------------------------------------------------------------
Every ``-dlgg`` rounds (rounds ``t`` with ``t % dlgg == 0``, as PFLlib: round 0 is attacked, so a
short run tests it), the server takes the uploads of the round's first ``--dlg_clients`` clients
(0 = every upload, PFLlib's choice; the default 1 keeps the cost of a run bounded: one attack is
``--dlg_iters`` L-BFGS steps of up to 20 double-backward passes each).

* **The observed gradient.** A client uploads its model after local training, so the server
  sees the delta ``w_global - w_client``. With one local step it is exactly ``lr * grad`` of that
  step's minibatch. PFLlib's ``call_dlg`` uses the raw delta as the gradient (off by the factor
  ``lr`` · steps). We divide it by ``lr * steps`` (the client's learning rate that round, with
  ``-ld`` decay, and its number of local steps): the mean gradient of the local steps, which is
  the one step's gradient when there was one step. Only the entries the algorithm uploads
  (``Server.shared``) are matched: the others carry the server's own values.
* **The reconstructed batches.** As PFLlib's ``-bnpc`` (``batch_num_per_client``): the first
  ``bnpc`` minibatches the client actually trained on that round (its batch plan, which the
  simulation recomputes from (seed, round, client)); each is reconstructed separately against
  the same observed gradient, as PFLlib does. With several local steps that target mixes the
  other steps' gradients, taken at other points of the trajectory, so the attack is weaker:
  that is what it really faces (PFLlib instead attacks ``bnpc`` batches of a fresh shuffle of the
  client's data, which need not be the ones it trained on).
* **The model and loss.** The server's model (the global model it sent), in eval mode (the
  client's dropout masks are unknown to the server), and the cross-entropy of plain local SGD:
  an algorithm whose local objective adds terms (FedProx's proximal term, zero at the first
  step; MOON's contrastive term) makes the observed gradient differ from what the attack models.
  Where only part of the model is shared, the unshared part is the server's own values (a
  client's private layers never reach the server).
* **Dummy data** start from N(0, 1) draws of the stream (seed, "dlg", round, client, batch), as
  the paper's ``torch.randn`` (PFLlib squashes them through a sigmoid into [0, 1]; our inputs are
  normalised, so we optimise them as they are). Batches of one sample use iDLG's label; larger
  batches optimise soft labels jointly (DLG). The matched distance is ``||g(x') - g||^2 /
  ||g||^2`` (the paper's squared distance divided by a constant: the same minimiser). L-BFGS (lr 1,
  strong-Wolfe line search) runs ``--dlg_iters`` steps in float64 with its stopping tolerances
  off: in float32 with torch's default tolerances it stopped near a relative distance of 1e-7,
  which left about 35 dB on a clean gradient where float64 reaches 55-70 dB.

Measures (``rs_dlg_psnr``, ``rs_dlg_ssim``, ``rs_dlg_label_acc``, one value per attacked round
listed in ``rs_dlg_rounds``, each the mean over the round's attacked samples): inputs are scaled to [0, 1] by the dataset's input range
(reconstructions clipped to it), PSNR = ``10 log10(1 / MSE)`` per sample, capped at 100 dB
(PFLlib's divides the MSE by 3), SSIM with Wang et al.'s 11x11 Gaussian window (σ 1.5, shrunk to
the image for smaller inputs; NaN for inputs that are not images). In a batch the reconstructions come in any order,
so they are matched to the true samples by the assignment of least total squared error before
measuring. A picture of the true (top) and reconstructed (bottom) inputs of the round goes to
``<result>_dlg_round<t>.png`` beside the run's result file (``Runtime.artifacts``; none when the
run writes no files, as in the benchmark).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from argparse import ArgumentParser
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from flcore.extension import RoundPlugin, refused_by_changing_widths
from flcore.flat import Segment
from flcore.protocol import RoundResult, Runtime
from flcore.registry import register_plugin
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import torch_generator

log = logging.getLogger("fl")

#: L-BFGS evaluations per optimiser step (torch's default max_iter, as the paper's code)
LBFGS_INNER = 20
#: samples shown in the picture of one round
MAX_PICTURED = 16


@dataclass
class Reconstruction:
    """What one DLG run produced: dummy inputs, their labels, and the final matching distance."""

    inputs: torch.Tensor
    labels: torch.Tensor
    distance: float


# ------------------------------------------------------------------ the attack itself
def idlg_label(grad: torch.Tensor, segments: Sequence[Segment], num_classes: int) -> int | None:
    """iDLG's label of a one-sample batch from the flat gradient ``grad`` (trainable part), or None
    when the classifier's gradient is absent (not uploaded) or all zero.

    The classifier is the model's ``head`` (else the last layer of ``num_classes`` outputs): its
    bias gradient is ``softmax - onehot``, negative only at the label; without a bias, each row of
    its weight gradient is that entry times the (non-negative) features."""
    params = [s for s in segments if s.is_param]
    candidates = [s for s in params if s.in_head] or params
    bias = [s for s in candidates if s.shape == (num_classes,)]
    weight = [s for s in candidates if len(s.shape) == 2 and s.shape[0] == num_classes]
    if bias:
        scores = grad[bias[-1].start : bias[-1].stop]
    elif weight:
        seg = weight[-1]
        scores = grad[seg.start : seg.stop].view(seg.shape).sum(1)
    else:
        return None
    if not bool(scores.ne(0).any()):
        return None
    return int(scores.argmin())


def reconstruct(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    weights: torch.Tensor,
    target: torch.Tensor,
    input_shape: Sequence[int],
    batch: int,
    num_classes: int,
    *,
    mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    iterations: int = 100,
    generator: torch.Generator | None = None,
) -> Reconstruction:
    """DLG: dummy inputs whose cross-entropy gradient at ``weights`` matches ``target``.

    ``forward(w, x)`` gives the logits of the model with trainable parameters ``w`` (a flat
    vector); ``target`` is the observed gradient over the entries ``mask`` selects (all when
    None); ``labels`` known (iDLG) fix the labels, else soft labels are optimised as well."""
    device, dtype = weights.device, torch.float64  # float32 rounding floors the distance near 1e-7
    dummy = torch.randn(batch, *input_shape, generator=generator).to(device, dtype).requires_grad_(True)
    variables = [dummy]
    if labels is None:
        label_logits = torch.randn(batch, num_classes, generator=generator).to(device, dtype).requires_grad_(True)
        variables.append(label_logits)
    w = weights.detach().to(dtype).requires_grad_(True)
    target = target.detach().to(device, dtype)
    scale = target.pow(2).sum().clamp_min(torch.finfo(dtype).tiny)
    optimiser = torch.optim.LBFGS(variables, lr=1.0, max_iter=LBFGS_INNER, history_size=100,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-15)

    def distance() -> torch.Tensor:
        logits = forward(w, dummy)
        soft = labels if labels is not None else label_logits.softmax(-1)
        (grad,) = torch.autograd.grad(F.cross_entropy(logits, soft), w, create_graph=True)
        if mask is not None:
            grad = grad[mask]
        return (grad - target).pow(2).sum() / scale

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        value = distance()
        value.backward()
        return value

    # L-BFGS's step returns the distance at the point it started from: each value is paired with
    # the iterate it was measured at, and the best finite one is kept (the optimiser may diverge).
    best: tuple = (math.inf, dummy.detach().clone(), None if labels is not None else label_logits.detach().clone())
    for step in range(iterations + 1):
        state = (dummy.detach().clone(), None if labels is not None else label_logits.detach().clone())
        value = float(optimiser.step(closure).detach()) if step < iterations else float(distance().detach())
        if not math.isfinite(value):
            break
        if value < best[0]:
            best = (value, *state)
        if value == 0.0:
            break
    value, inputs, soft_labels = best
    found = labels if labels is not None else soft_labels.argmax(-1)
    return Reconstruction(inputs, found, value)


# ------------------------------------------------------------------ measures
def to_unit_range(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``x`` mapped from the data range [low, high] to [0, 1], clipped."""
    return ((x.double() - low) / max(high - low, 1e-12)).clamp(0.0, 1.0)


def psnr(true: torch.Tensor, recon: torch.Tensor) -> float:
    """PSNR in dB of one sample scaled to [0, 1] (peak 1), capped at 100 dB (an exact copy, as
    PFLlib), so that one perfect reconstruction does not swamp a mean."""
    mse = float((true.double() - recon.double()).pow(2).mean())
    return 100.0 if mse <= 1e-10 else 10.0 * math.log10(1.0 / mse)


def ssim(true: torch.Tensor, recon: torch.Tensor, window: int = 11, sigma: float = 1.5) -> float:
    """Mean SSIM (Wang et al. 2004) of two images ``[C, H, W]`` scaled to [0, 1]: Gaussian window
    ``window`` x ``window`` (σ ``sigma``; the largest odd size that fits smaller images), valid
    positions only, constants (0.01)² and (0.03)², averaged over channels and positions; NaN for
    inputs that are not images."""
    if true.dim() != 3:
        return float("nan")
    channels, height, width = true.shape
    size = min(window, height, width)
    size -= 1 - size % 2
    axis = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-axis.pow(2) / (2 * sigma**2))
    g = g / g.sum()
    kernel = torch.outer(g, g).expand(channels, 1, size, size)
    a, b = true.double().unsqueeze(0), recon.double().unsqueeze(0)

    def blur(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, kernel, groups=channels)

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a.pow(2)
    var_b = blur(b * b) - mu_b.pow(2)
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    index = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a.pow(2) + mu_b.pow(2) + c1) * (var_a + var_b + c2))
    return float(index.mean())


def match_order(true: torch.Tensor, recon: torch.Tensor) -> torch.Tensor:
    """The order of ``recon``'s samples that pairs them with ``true``'s at least total squared
    error (DLG recovers a batch's samples in no particular order)."""
    if len(true) == 1:
        return torch.zeros(1, dtype=torch.long)
    from scipy.optimize import linear_sum_assignment

    cost = torch.cdist(true.flatten(1).double(), recon.flatten(1).double()).pow(2).cpu().numpy()
    rows, cols = linear_sum_assignment(cost)
    return torch.as_tensor(cols[np.argsort(rows)], dtype=torch.long)


# ------------------------------------------------------------------ the round callback
@dataclass
class AttackedSample:
    """One true input and its reconstruction, scaled to [0, 1], with the measures."""

    true: torch.Tensor
    recon: torch.Tensor
    psnr: float
    ssim: float
    label_ok: bool


@register_plugin("dlg")
class DLGAttack(RoundPlugin):
    """``-dlg``: attacks the round's uploads every ``-dlgg`` rounds and records ``dlg_psnr``,
    ``dlg_ssim`` and ``dlg_label_acc`` (see the module docstring); pictures go to
    ``<Runtime.artifacts>_dlg_round<t>.png`` where the run has an artifacts stem."""

    flag_group = "DLG privacy attack on the uploads (PFLlib's -dlg -dlgg -bnpc; flcore/features/dlg.py)"
    flag_order = 60
    order = 200  # observes the round once every other plug-in has had it

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "-dlg", "--dlg_eval", type=bool, default=False,
                 help="DLG/iDLG privacy attack on the uploads: records rs_dlg_psnr/ssim and saves "
                      "results/<run>_dlg_round<t>.png (flcore/features/dlg.py)")
        add_flag(parser, "-dlgg", "--dlg_gap", type=int, default=100, low=1, help="attack the rounds t with t %% dlgg == 0 (round 0 included)")
        add_flag(parser, "-bnpc", "--batch_num_per_client", type=int, default=2, low=1,
                 help="minibatches of each attacked client that DLG reconstructs (the first it trained on that round)")
        add_flag(parser, "--dlg_clients", type=int, default=1, low=0,
                 help="uploads attacked per -dlg round, in cohort order (0 = every upload, as PFLlib)")
        add_flag(parser, "--dlg_iters", type=int, default=100, low=1, help="L-BFGS steps of each DLG reconstruction (PFLlib: 100)")

    @classmethod
    def wanted(cls, args) -> bool:
        return bool(cls.flags(args).dlg_eval)

    @classmethod
    def compatible(cls, server_cls: type) -> str | None:
        return refused_by_changing_widths(server_cls, "-dlg")

    def __init__(self, runtime: Runtime, server_cls: type):
        super().__init__(runtime, server_cls)
        dataset = runtime.dataset
        x = dataset.split("train")[0]
        if not x.is_floating_point() and dataset.input_table is None:
            raise FLError(f"-dlg reconstructs continuous inputs; dataset {runtime.args.dataset} holds token ids")
        # the data range that PSNR/SSIM and the picture scale to [0, 1]
        values = dataset.input_table if dataset.input_table is not None else x
        self.low, self.high = (float(values.min()), float(values.max())) if values.numel() else (0.0, 1.0)
        flags = self.flags(runtime.args)
        self.gap = flags.dlg_gap
        self.batches = flags.batch_num_per_client
        self.clients = flags.dlg_clients
        self.iterations = flags.dlg_iters

    def observe_round(self, result: RoundResult) -> None:
        if not result.trained or result.round % self.gap:
            return
        attacked = [u for u in result.updates if u.uploads_params and u.num_steps > 0]
        if self.clients > 0:
            attacked = attacked[: self.clients]
        samples: list[AttackedSample] = []
        for update in attacked:
            samples += self.attack_upload(result, update)
        if not samples:
            log.info("round %d: DLG found no upload of a trained model to attack", result.round)
            return
        mean_psnr = float(np.mean([s.psnr for s in samples]))
        mean_ssim = float(np.mean([s.ssim for s in samples]))
        label_acc = float(np.mean([s.label_ok for s in samples]))
        history = self.runtime.history
        history.add_series("dlg_rounds", result.round)
        history.add_series("dlg_psnr", mean_psnr)
        history.add_series("dlg_ssim", mean_ssim)
        history.add_series("dlg_label_acc", label_acc)
        picture = self.save_picture(samples, result.round)
        log.info("round %d: DLG on %d sample(s) of %d client(s): PSNR %.2f dB, SSIM %.3f, labels %.0f%% right%s",
                 result.round, len(samples), len(attacked), mean_psnr, mean_ssim, 100 * label_acc,
                 f" ({picture})" if picture else "")

    def results(self, history) -> dict[str, Any]:
        """The attack's mean PSNR and SSIM over the attacked rounds."""
        psnrs = history.extra_series.get("dlg_psnr")
        if not psnrs:
            return {}
        ssim_values = [v for v in history.extra_series["dlg_ssim"] if np.isfinite(v)]  # NaN: inputs that are not images
        return {"dlg_psnr_mean": float(np.mean(psnrs)),
                "dlg_ssim_mean": float(np.mean(ssim_values)) if ssim_values else float("nan")}

    def lines(self, results: dict[str, Any]) -> list[str]:
        if "dlg_psnr_mean" not in results:
            return []
        return [f"  DLG attack: mean PSNR {results['dlg_psnr_mean']:.2f} dB, SSIM {results['dlg_ssim_mean']:.3f}"]

    def attack_upload(self, result: RoundResult, update) -> list[AttackedSample]:
        """Reconstruct the first ``-bnpc`` minibatches one client trained on from its upload."""
        runtime = self.runtime
        args = runtime.args
        client = runtime.clients[update.index]
        model = runtime.model
        start = result.package.global_params
        p = model.num_params
        lr = float(args.local_learning_rate)
        if args.learning_rate_decay:  # the rate of this round: finish_job has counted it already
            lr *= float(args.learning_rate_decay_gamma) ** (client.participations - 1)
        grad = (start[:p] - update.params[:p]).to(model.vector.dtype) / (lr * update.num_steps)
        mask = None if runtime.shared is None else runtime.shared[:p]
        target = grad if mask is None else grad[mask]
        model.load(start)
        model.module.eval()
        net = model.net
        buffers = start[p:].double()  # float buffers (BatchNorm statistics) in the attack's float64

        def forward(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return net.at(torch.cat([w, buffers]))(x)

        plan = client.batch_plan(result.round)
        out = []
        for k, idx in enumerate(plan[: self.batches]):
            true_x = client.data.inputs("train", idx)
            true_y = client.data.train_y[idx]
            label = idlg_label(grad, model.segments, runtime.num_classes) if len(idx) == 1 else None
            known = None if label is None else torch.tensor([label], device=true_y.device)
            generator = torch_generator(args.seed, "dlg", result.round, client.cid, k)
            found = reconstruct(forward, start[:p], target, true_x.shape[1:], len(idx),
                                runtime.num_classes, mask=mask, labels=known, iterations=self.iterations,
                                generator=generator)
            out += self.measure(true_x, true_y, found)
        model.module.train()
        return out

    def measure(self, true_x: torch.Tensor, true_y: torch.Tensor, found: Reconstruction) -> list[AttackedSample]:
        order = match_order(true_x, found.inputs.to(true_x.device))
        recon, labels = found.inputs[order.to(found.inputs.device)], found.labels[order.to(found.labels.device)]
        samples = []
        for t, r, y, y_hat in zip(true_x, recon, true_y, labels):
            t01, r01 = to_unit_range(t.cpu(), self.low, self.high), to_unit_range(r.detach().cpu(), self.low, self.high)
            samples.append(AttackedSample(t01, r01, psnr(t01, r01), ssim(t01, r01), int(y) == int(y_hat)))
        return samples

    def save_picture(self, samples: list[AttackedSample], rnd: int) -> Path | None:
        """True inputs (top row) over their reconstructions (bottom row), with each PSNR."""
        shown = [s for s in samples if s.true.dim() == 3 and s.true.shape[0] in (1, 3)][:MAX_PICTURED]
        stem = self.runtime.artifacts
        if stem is None or not shown:
            return None
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(max(1.6 * len(shown), 3.2), 3.6))
        FigureCanvasAgg(figure)
        axes = figure.subplots(2, len(shown), squeeze=False)
        for col, sample in enumerate(shown):
            for row, image in enumerate((sample.true, sample.recon)):
                ax = axes[row][col]
                pixels = image.permute(1, 2, 0).numpy()
                ax.imshow(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
            axes[1][col].set_xlabel(f"{sample.psnr:.1f} dB", fontsize=8)
        axes[0][0].set_ylabel("true")
        axes[1][0].set_ylabel("DLG")
        figure.suptitle(f"DLG reconstruction, round {rnd}", fontsize=9)
        path = stem.with_name(f"{stem.name}_dlg_round{rnd}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100)
        return path
