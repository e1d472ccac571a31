"""Why ignoring stragglers overtakes Sageflow late in a run, measured along Sageflow's own run.

Sageflow's stragglers-only row of ``sageflow_mnist.py`` (its setting, flags and data: MNIST shards,
100 clients, 20% a round, 1,000 public samples, delays U{0, 1, 2}, B = 10, lr 0.1, the official γ
halving unless ``--gamma_halving``), run with ``--sageflow_diagnostics``: in every round the server
also builds the model that ignoring stragglers would have made from the same global model w_t and the
same fresh uploads (their sample-weighted mean f, no mixing), and records both models' test accuracy,
the norms of both steps, the stale groups' weight in the mix, and where the stale groups' step points
(the pull back to their older start models and their own training, each against the fresh step;
``flcore/servers/serversageflow.py``'s docstring). The staleness of every upload is ``rs_staleness``.
The counterfactual draws nothing and changes nothing: the run's curve is Sageflow's as
``sageflow_mnist.py`` makes it.

``--damped_ignoring γ`` runs ignoring stragglers instead, with Sageflow's damped server step
w ← (1 − γ_t) w + γ_t f (same halving): whether Sageflow's short steps alone make a run stall.
Each seed draws its own public set (``--seed k``); a ``-t 3`` series of ``sageflow_mnist.py`` draws
all three from its first seed, so only seed 0 is the same run as there.

Each seed is a results folder of its own, so two processes may run two seeds side by side;
``--report`` reads the seeds' files and prints the per-round table (every ``--every`` rounds) and a
summary by ten-round windows, also written to ``out/<name>.md``.

Usage (from the repository root)::

    S="nice -n 10 .venv/bin/python experiments/sageflow_diagnosis.py --samples 150 --rounds 40 --local_epochs 5"
    $S --seed 0 & $S --seed 1; wait; $S --seed 2
    $S --report --seeds 0 1 2
    $S --seed 0 --damped_ignoring 0.5; $S --report --seeds 0 --damped_ignoring 0.5
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import h5py
import numpy as np

from common import add_training_flags, results_folder, run_variant, write_table
from flcore.registry import load_all  # importable once common has put system/ on the path
from flcore.servers.serversageflow import halved_gamma
from sageflow_mnist import GAMMA_HALVING, RAW, data_folder, public, variants

#: the recorded series (rs_sageflow_<name>), one value per training round
SERIES = ("next_acc", "fresh_only_acc", "step_norm", "fresh_step_norm", "step_along_fresh", "stale_step_norm",
          "stale_pull_norm", "stale_progress_norm", "stale_fresh_cos", "stale_progress_cos", "stale_weight")


def experiment_name(args: argparse.Namespace, halving: int) -> str:
    return (f"sageflow_diagnosis_{args.dataset}_{args.samples or 'all'}s_E{args.local_epochs}_{args.rounds}r"
            + (f"_ignoring_gamma{args.damped_ignoring:g}" if args.damped_ignoring else "")
            + (f"_gamma_halving{halving}" if halving != GAMMA_HALVING[args.dataset] else ""))


def sageflow_row(samples: int, halving: int, damped_ignoring: float = 0.0) -> tuple[str, list[str]]:
    """(-algo, flags): sageflow_mnist.py's Sageflow row of the stragglers setting, with the diagnostics;
    with ``damped_ignoring`` γ > 0, ignoring stragglers with Sageflow's damped step instead: the late
    uploads dropped, no filter, sample weights (FedAvg's fresh-only mean f, bit for bit at γ = 1), and
    w ← (1 − γ_t) w + γ_t f with the same γ halving."""
    _, algo, flags = next(row for row in variants("stragglers", 0.1, halving=halving) if row[0] == "Sageflow")
    if damped_ignoring:  # later flags replace the row's own
        flags = [*flags, "--straggler_policy", "ignore", "--sageflow_eth", "inf", "--sageflow_delta", "0",
                 "--sageflow_gamma", str(damped_ignoring)]
    return algo, ["-jr", "0.2", *public(samples), *flags, "--sageflow_diagnostics", "True"]


def label_of(seed: int) -> str:
    return f"Sageflow seed {seed}"


def run_seed(args: argparse.Namespace, name: str, halving: int, seed: int) -> Path:
    """Sageflow's stragglers row with the diagnostics, one seed; its results file."""
    algo, flags = sageflow_row(args.samples, halving, args.damped_ignoring)
    one = copy.copy(args)
    one.seed, one.times = seed, 1
    extra = ["--engine", "sequential", "--num_threads", "1", "--eval_gap", str(args.eval_gap)]
    run = run_variant(name, label_of(seed), algo, flags, data_folder(args), one, "CNN", args.rounds, extra)
    if isinstance(run, str):
        raise SystemExit(f"seed {seed}: {run}")
    print(f"seed {seed}: {run.seconds():.0f} s", flush=True)
    return run.paths[0]


def read_seed(path: Path) -> dict[str, np.ndarray]:
    """The diagnostics of one run (index t: round t's aggregation), the staleness counts per round
    (columns: 0, 1, 2, ... rounds late) and the evaluated curve."""
    with h5py.File(path, "r") as f:
        out = {name: np.asarray(f["rs_sageflow_" + name], dtype=float) for name in SERIES}
        late = np.asarray(f["rs_staleness"], dtype=float)
        out["test_acc"] = np.asarray(f["rs_test_acc"], dtype=float)
        out["eval_rounds"] = np.asarray(f["rs_eval_rounds"], dtype=int)
    out["late"] = np.stack([(late == s).sum(1) for s in range(int(np.nanmax(late)) + 1)], axis=1)
    return out


def check_curve(seed: int, run: dict[str, np.ndarray]) -> None:
    """The diagnostics' w_{t+1} is the model the run evaluates after round t (a consistency check)."""
    for r, acc in zip(run["eval_rounds"], run["test_acc"]):
        if r > 0 and run["next_acc"][r - 1] != acc:
            raise SystemExit(f"seed {seed}: rs_sageflow_next_acc[{r - 1}] = {run['next_acc'][r - 1]} but the curve "
                             f"has {acc} at round {r}")


def fmt(values: np.ndarray, digits: int, scale: float = 1.0) -> str:
    present = scale * values[np.isfinite(values)]
    if not present.size:
        return "–"
    if present.size == 1:
        return f"{present[0]:.{digits}f}"
    return f"{present.mean():.{digits}f} ± {present.std():.{digits}f}"


def report(args: argparse.Namespace, name: str, halving: int) -> None:
    folder_of = {seed: results_folder(name, label_of(seed)) for seed in args.seeds}
    runs = {}
    for seed, folder in folder_of.items():
        files = sorted(folder.glob("*.h5"))
        if not files:
            raise SystemExit(f"no results for seed {seed} in {folder}: run this script with --seed {seed} first")
        runs[seed] = read_seed(files[0])
        check_curve(seed, runs[seed])
    rounds = min(len(r["next_acc"]) for r in runs.values())
    stack = {key: np.stack([r[key][:rounds] for r in runs.values()]) for key in SERIES}
    width = max(r["late"].shape[1] for r in runs.values())
    late = np.stack([np.pad(r["late"][:rounds], ((0, 0), (0, width - r["late"].shape[1]))) for r in runs.values()])
    base = args.damped_ignoring or 1.0  # Sageflow's γ is sageflow_mnist.py's 1
    gamma = np.array([halved_gamma(base, halving, t) for t in range(rounds)])
    run_name = f"ignoring with a damped step (γ = {base:g})" if args.damped_ignoring else "Sageflow"
    gain = 100 * (stack["fresh_only_acc"] - stack["next_acc"])  # points the fresh-only model is ahead
    seeds = ", ".join(map(str, runs))
    lines = [f"# {run_name}'s step against ignoring stragglers' fresh-only step, {args.dataset}, "
             f"{args.samples or 'all'} rows a client, E = {args.local_epochs}, {rounds} rounds, seeds {seeds} "
             f"(mean ± std over seeds; round t: the aggregation that makes w_(t+1))", "",
             "| round t | the run's w_(t+1) acc % | fresh-only f acc % | f − w_(t+1), points | ‖s‖ | ‖s_f‖ "
             "| ⟨s, s_f⟩/‖s_f‖² | ‖z_s − w_t‖ | ‖pull‖ | ‖own‖ | cos(z_s − w_t, s_f) | cos(own, s_f) "
             "| stale weight Σα | γ_t | uploads 0/1/2 late |", "|---" * 15 + "|"]
    for t in range(0, rounds, args.every):
        mix = "/".join(f"{v:.1f}" for v in late[:, t].mean(0)[:3])
        lines.append(f"| {t} | {fmt(stack['next_acc'][:, t], 2, 100)} | {fmt(stack['fresh_only_acc'][:, t], 2, 100)} "
                     f"| {fmt(gain[:, t], 2)} | {fmt(stack['step_norm'][:, t], 3)} "
                     f"| {fmt(stack['fresh_step_norm'][:, t], 3)} | {fmt(stack['step_along_fresh'][:, t], 2)} "
                     f"| {fmt(stack['stale_step_norm'][:, t], 3)} | {fmt(stack['stale_pull_norm'][:, t], 3)} "
                     f"| {fmt(stack['stale_progress_norm'][:, t], 3)} | {fmt(stack['stale_fresh_cos'][:, t], 2)} "
                     f"| {fmt(stack['stale_progress_cos'][:, t], 2)} | {fmt(stack['stale_weight'][:, t], 2)} "
                     f"| {gamma[t]:g} | {mix} |")
    lines += ["", "By ten-round windows (every round of every seed; ratios are means of the per-round ratios; "
              "divided by γ_t: the share of the fresh step that the mix z itself takes):", "",
              "| rounds | f − w_(t+1), points | f better / worse / level | ‖s‖ / ‖s_f‖ | ⟨s, s_f⟩/‖s_f‖² "
              "| the same / γ_t | of it, the stale groups' | the fresh group's own ⟨v_t − w_t, s_f⟩/‖s_f‖² "
              "| ‖pull‖ / ‖s_f‖ | ‖own‖ / ‖s_f‖ | cos(z_s − w_t, s_f) | cos(own, s_f) | stale weight |",
              "|---" * 13 + "|"]
    # z − w_t = (1 − Σα) (v_t − w_t) + Σα (z_s − w_t): the share of s_f the mix takes, split into its parts
    mix_along = stack["step_along_fresh"] / gamma
    stale_along = np.nan_to_num(stack["stale_weight"] * stack["stale_step_norm"] * stack["stale_fresh_cos"]
                                / stack["fresh_step_norm"])  # 0 in a round without a stale group
    with np.errstate(divide="ignore", invalid="ignore"):
        fresh_along = (mix_along - stale_along) / (1 - stack["stale_weight"])
    window = max(1, rounds // 4)
    for first in range(0, rounds, window):
        part = slice(first, min(first + window, rounds))
        g = gain[:, part]
        fresh = stack["fresh_step_norm"][:, part]

        def mean(values: np.ndarray, digits: int = 2) -> str:  # "–" where no round has the value
            present = values[np.isfinite(values)]
            return f"{present.mean():.{digits}f}" if present.size else "–"

        lines.append(f"| {first}-{min(first + window, rounds) - 1} | {mean(g)} "
                     f"| {int((g > 0).sum())} / {int((g < 0).sum())} / {int((g == 0).sum())} "
                     f"| {mean(stack['step_norm'][:, part] / fresh)} | {mean(stack['step_along_fresh'][:, part])} "
                     f"| {mean(mix_along[:, part])} | {mean(stale_along[:, part])} | {mean(fresh_along[:, part])} "
                     f"| {mean(stack['stale_pull_norm'][:, part] / fresh)} "
                     f"| {mean(stack['stale_progress_norm'][:, part] / fresh)} "
                     f"| {mean(stack['stale_fresh_cos'][:, part])} | {mean(stack['stale_progress_cos'][:, part])} "
                     f"| {mean(stack['stale_weight'][:, part])} |")
    finals = ", ".join(f"{100 * r['test_acc'][-1]:.2f}" for r in runs.values())
    lines += ["", f"Round {rounds} accuracy of the run itself, seeds {seeds}: {finals}"]
    write_table(name, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=list(RAW), default="MNIST")
    parser.add_argument("--rounds", type=int, default=40, help="global rounds")
    parser.add_argument("--samples", type=int, default=150,
                        help="training samples kept per client, before the public set is taken out (0: all ~600)")
    parser.add_argument("--eval_gap", type=int, default=2,
                        help="the run's own evaluation every k rounds (the diagnostics evaluate every round anyway)")
    parser.add_argument("--gamma_halving", type=int, default=None,
                        help="Sageflow's γ halving period in rounds (0: off; default: the official code's)")
    parser.add_argument("--damped_ignoring", type=float, default=0.0,
                        help="run ignoring stragglers with Sageflow's damped step w <- (1 - γ) w + γ f instead, at this γ "
                             "(halved as --gamma_halving): do Sageflow's short steps alone make it stall? 0: Sageflow")
    parser.add_argument("--data", type=Path, default=None, help="dataset folder (default: sageflow_mnist.py's)")
    parser.add_argument("--report", action="store_true", help="only read the seeds' results and print the table")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--report: the seeds to read")
    parser.add_argument("--every", type=int, default=4, help="--report: a table row every k rounds")
    add_training_flags(parser, lr=0.1, lr_help="local lr (plain SGD, as sageflow_mnist.py)", batch_size=10)
    parser.set_defaults(times=1)  # one seed a process: two processes run two seeds side by side
    args = parser.parse_args()
    if args.eval_gap < 1 or args.rounds % args.eval_gap:
        parser.error(f"--eval_gap must be >= 1 and divide --rounds ({args.rounds}), got {args.eval_gap}")
    if not 0 <= args.damped_ignoring <= 1:
        parser.error(f"--damped_ignoring must be in (0, 1] (0: Sageflow itself), got {args.damped_ignoring}")
    if args.every < 1:
        parser.error(f"--every must be >= 1, got {args.every}")
    if args.gamma_halving is not None and args.gamma_halving < 0:
        parser.error(f"--gamma_halving must be >= 0 (0: no halving), got {args.gamma_halving}")
    halving = GAMMA_HALVING[args.dataset] if args.gamma_halving is None else args.gamma_halving
    name = experiment_name(args, halving)
    if args.report:
        report(args, name, halving)
        return
    load_all()
    for seed in range(args.seed, args.seed + args.times):
        run_seed(args, name, halving, seed)


if __name__ == "__main__":
    main()
