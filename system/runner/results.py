"""One run trained and its results written: checkpoints every ``--checkpoint_every`` rounds and at
a signal, results so far when interrupted or diverged (marked unfinished), and the finished
results committed with their models so that a finished h5 always has its model beside it."""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from runner.checkpoint import load_checkpoint, load_server_state, save_checkpoint, server_state
from utils.errors import Diverged, FLError
from utils.interrupts import INTERRUPTS
from utils.live import live_callbacks
from utils.mem_utils import peak_gpu_mb, peak_rss_mb
from flcore.features import run_summary
from reporting.results import machine_record, save_results, write_atomically
from runner.run_control import Claim, RunInterrupted, StopOnSignal, is_finished

log = logging.getLogger("fl")


#: the model is written after the last round, so a missing package is refused before the first
SAVE_MODEL_NEEDS_SAFETENSORS = ("--save_model (on by default) needs the safetensors package: "
                                "pip install -r requirements.txt, or pass --save_model False")


def train_one(server, run_args: argparse.Namespace, run_index: int, claimed: Claim,
              device: torch.device) -> tuple[dict, Path]:
    """Train one run (from its checkpoint with --resume) and write its results; an interruption
    or divergence still writes the results so far, marked unfinished."""
    start_round, elapsed = 0, 0.0
    if claimed.action == "resume":
        saved = load_checkpoint(claimed.checkpoint, run_args)
        start_round = load_server_state(server, saved)
        elapsed = float(saved.get("elapsed_s", 0.0))
        log.info("run %d: resuming at round %d from %s", run_index, start_round, claimed.checkpoint)
    started = time.perf_counter()

    def run_time() -> float:
        return elapsed + time.perf_counter() - started

    def save(finished: bool, to: Path | None = None, **extra) -> tuple[dict, Path]:
        history = server.history
        model_bytes = server.global_params.numel() * server.global_params.element_size()
        summary = run_summary(history, run_args.avg_last, run_args.target_acc, model_bytes)
        summary.update(peak_rss_mb=peak_rss_mb(), wall_time_s=run_time())
        metric = server.runtime.objective.metric
        if metric != "accuracy":  # what rs_test_acc and the accuracies measure (absent: accuracy)
            summary["metric"] = metric
        for plugin in server.plugins.values():  # the features' figures: final epsilon, new clients, DLG
            summary.update(plugin.results(history))
        gpu = peak_gpu_mb(device)
        if gpu is not None:
            summary["peak_gpu_mb"] = gpu
        attrs = {
            "algorithm": run_args.algorithm, "dataset": Path(run_args.dataset).name, "goal": run_args.goal,
            "run": run_index, "seed": run_args.seed, "model": run_args.model, "device": str(device),
            "config": json.dumps(vars(run_args), default=str), "torch_version": torch.__version__,
            "machine": json.dumps(machine_record(), sort_keys=True),
            "finished": finished, "personalized": bool(server.personalized), **extra,  # read by reporting/
        }
        return summary, save_results(to or claimed.result, history, attrs, summary)

    every = int(run_args.checkpoint_every)

    def round_end(srv, next_round: int) -> None:
        """Checkpoint every ``--checkpoint_every`` rounds, and before stopping at a signal."""
        if stop.requested is not None or (every > 0 and next_round % every == 0):
            state = server_state(srv, next_round)
            state["elapsed_s"] = run_time()
            save_checkpoint(claimed.checkpoint, state)
        if stop.requested is not None:
            raise RunInterrupted(stop.requested, next_round)

    server.runtime.artifacts = claimed.result.with_suffix("")  # side files (DLG's pictures) beside the results
    try:
        with StopOnSignal() as stop:
            server.train(progress=run_args.progress and not run_args.quiet, start_round=start_round,
                         round_end=round_end, callbacks=live_callbacks(run_args, run_index))
    except RunInterrupted as exc:
        resume = " ".join(shlex.quote(a) for a in ["python", "main.py", *sys.argv[1:]] if a not in ("--overwrite",))
        if is_finished(claimed.result):  # an --overwrite stopped early: the finished results stay as they are
            where = f"the finished results in {claimed.result} are kept until this run completes"
        else:
            _, path = save(False, stopped_at_round=exc.next_round, stop_reason=str(exc))
            where = f"results so far in {path}"
        print(f"stopped after round {exc.next_round - 1}: {where}, checkpoint {claimed.checkpoint}; "
              f"continue with: {resume} --resume", file=sys.stderr)
        raise
    except Diverged as exc:
        if exc.collapse is not None and server.history.test_acc:  # the measured outcome (an attack's): results
            collapsed = exc.round
            print(f"round {collapsed}: {exc}; recorded as diverged from round {collapsed}", file=sys.stderr)
            summary = commit_results(server, run_args, claimed.result,
                                     lambda finished, to=None: save(finished, to, diverged_round=collapsed))
            summary["diverged_round"] = collapsed
            claimed.checkpoint.unlink(missing_ok=True)
            return summary, claimed.result
        if is_finished(claimed.result):  # a diverged --overwrite never replaces finished results
            raise Diverged(f"{exc} (the finished results in {claimed.result} and their model are kept; "
                           "nothing of this run was written)", exc.round) from None
        if not server.history.test_acc:
            raise
        _, path = save(False, stopped_at_round=exc.round, stop_reason=str(exc))
        raise Diverged(f"{exc} (results up to round {exc.round} kept in {path}, marked unfinished)", exc.round) from None
    summary = commit_results(server, run_args, claimed.result, save)
    claimed.checkpoint.unlink(missing_ok=True)  # the results are complete: nothing left to resume
    return summary, claimed.result


def commit_results(server, run_args: argparse.Namespace, result: Path, save) -> dict:
    """Write the model(s) and the finished results under temporary names, then rename them into
    place, models first: an h5 marked finished always has its model beside it, and results that
    ``--overwrite`` replaces stay untouched until every new file is complete. Returns the summary."""
    staged: dict[Path, Path] = {}  # final name -> the complete file under a temporary name
    try:
        if run_args.save_model:
            staged.update(stage_model(server, result))
        for final, write in server.result_files(result).items():  # FLChain's ledger
            write_atomically(staging_name(final), write)
            staged[final] = staging_name(final)
        summary, staged[result] = save(True, to=staging_name(result))
        with INTERRUPTS.deferred():  # a Ctrl-C now would split the pair (a signal mask cannot stop it)
            for stale in set(model_paths(result)) - set(staged):  # a replaced run's: they would not match
                stale.unlink(missing_ok=True)
            for final, tmp in staged.items():
                os.replace(tmp, final)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    return summary


def staging_name(path: Path) -> Path:
    """Where a file waits, complete, until :func:`commit_results` renames it to ``path``."""
    return path.parent / f".{path.name}.new"


def model_paths(result: Path) -> tuple[Path, Path]:
    """The global model and the personal models of the run whose results are ``result``."""
    return result.with_suffix(".safetensors"), result.with_suffix(".personal.safetensors")


def stage_model(server, result: Path) -> dict[Path, Path]:
    """The final global model for ``<result>.safetensors`` (a plain state_dict: load it with
    ``module.load_state_dict(safetensors.torch.load_file(path))``); personalised algorithms also
    each client's model for ``<result>.personal.safetensors`` under ``client<i>/``. Written under
    temporary names (:func:`staging_name`); returns {final name: written file}."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise FLError(SAVE_MODEL_NEEDS_SAFETENSORS) from None

    def state_of(params: torch.Tensor, prefix: str = "") -> dict[str, torch.Tensor]:
        model = server.model_of(params)
        model.load(params)
        # the module's tensors are views of one vector: safetensors wants separate, contiguous ones
        return {prefix + k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.module.state_dict().items()}

    path, personal_path = model_paths(result)
    staged: dict[Path, Path] = {}
    try:
        write_atomically(staging_name(path), lambda tmp: save_file(state_of(server.global_params), tmp))
        staged[path] = staging_name(path)
        if server.personalized or server.shared_mask is not None:
            personal: dict[str, torch.Tensor] = {}
            for client in server.clients:
                personal.update(state_of(server.eval_params(client.index), f"client{client.index}/"))
            write_atomically(staging_name(personal_path), lambda tmp: save_file(personal, tmp))
            staged[personal_path] = staging_name(personal_path)
    except BaseException:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise
    return staged


def print_summary(run_index: int, summary: dict, path: Path, plugins=()) -> None:
    metric = summary.get("metric", "accuracy")  # a multi-label dataset's recall@5 (flcore/objectives.py)
    lines = [
        f"Run {run_index}: best {metric} {summary['best_acc']:.4f}, final {summary['final_acc']:.4f}, "
        f"mean of last 10% {summary['mean_acc_last_10pct']:.4f}, mean of last {summary['avg_last']} "
        f"{summary['mean_acc_last_n']:.4f}",
        f"  time {summary['wall_time_s']:.1f} s ({summary['mean_round_time'] or 0:.3f} s/round), "
        f"peak RSS {summary['peak_rss_mb']:.0f} MB"
        + (f", peak GPU {summary['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in summary else "")
        + f", uploaded {summary['total_bytes_up'] / 1e6:.1f} MB"
        + (f" ({summary['total_bytes_up_arrived'] / 1e6:.1f} MB arrived)"
           if summary.get("total_bytes_up_arrived", summary["total_bytes_up"]) != summary["total_bytes_up"] else ""),
    ]
    if "evaluated_clients" in summary:
        lines.append(f"  evaluated: a seeded sample of {summary['evaluated_clients']} clients at each evaluation (rs_eval_clients)")
    if "diverged_round" in summary:
        lines.append(f"  diverged: the model collapsed in round {summary['diverged_round']} (the h5's diverged_round); "
                     "the accuracies are those before it")
    if "early_stop" in summary:
        lines.append(f"  {summary['early_stop']}")
    if "target_acc" in summary:
        if summary["rounds_to_target"] is None:
            lines.append(f"  target {metric} {summary['target_acc']} not reached")
        else:
            lines.append(
                f"  target {summary['target_acc']} reached at round {summary['rounds_to_target']} after "
                f"{summary['uploads_to_target']:.1f} model uploads ({summary['bytes_up_to_target'] / 1e6:.1f} MB)"
            )
    if "uploads_aggregated" in summary:
        lines.append(f"  uploads: {summary['uploads_arrived']} arrived, {summary['uploads_aggregated']} put into the model")
    for plugin in plugins:  # each feature's figures (virtual time, staleness, privacy, new clients, DLG)
        lines += plugin.lines(summary)
    lines.append(f"  results: {path}")
    print("\n".join(lines))
