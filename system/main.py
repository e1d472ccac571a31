"""Run a federated-learning experiment: ``python main.py -data MNIST -m CNN -algo FedAvg -gr 2000 -did 0``.

The command line is PFLlib's (see ``python main.py -h``). ``-algo`` and ``-m`` are looked up in
registries; each algorithm declares its own flags, added here only for the selected algorithm.
Results go to ``results/<data>_<algo>_<goal>_<run>.h5``; anything the user can fix is reported
as one line on stderr with exit status 2.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from flcore.attacks.dlg import DLGAttack
from flcore.newclients import NewClientEvaluation, hold_out
from flcore.registry import ALGORITHMS, ENGINES, MODELS, SELECTORS, load_all
from utils.cli import (IGNORED_DEST, PFLLIB_ALGORITHM_FLAGS, accept_other_flags, declare_flags, declared_actions,
                       generic_parser, pfllib_algorithm_actions)
from utils.data_utils import FederatedDataset, load_federated_dataset
from utils.errors import FLError
from utils.mem_utils import peak_gpu_mb, peak_rss_mb
from utils.result_utils import result_path, save_results, summarize
from utils.seeding import derive_seed, seed_everything

log = logging.getLogger("fl")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults and keep the epilog's line breaks."""


def _probe(argv: list[str]) -> argparse.Namespace:
    """The names that decide which flags get their own types and defaults, found by exact token match
    before any parser exists (``-algo``, ``--algorithm``, ``--select``, ``--engine``, each also as
    ``name=value``)."""
    found = {"algorithm": "FedAvg", "select": "uniform", "engine": "auto"}
    names = {"-algo": "algorithm", "--algorithm": "algorithm", "--select": "select", "--engine": "engine"}
    for i, token in enumerate(argv):
        key, sep, value = token.partition("=")
        if key in names:
            if sep:
                found[names[key]] = value
            elif i + 1 < len(argv):
                found[names[key]] = argv[i + 1]
    return argparse.Namespace(**found)


def algorithm_flags_text() -> str:
    """One line per algorithm naming its flags, for the help epilog."""
    lines = []
    for name in ALGORITHMS.names():
        flags = [action.option_strings[0] for action in declared_actions(*_algorithm_classes(ALGORITHMS.get(name)))]
        lines.append(f"  {name}: {' '.join(flags) if flags else '(no own flags)'}")
    return "\n".join(lines)


def _algorithm_classes(server_cls: type) -> tuple[type, ...]:
    """The classes whose flags belong to an algorithm: its server, its client and a fixed policy."""
    fixed = (SELECTORS.get(server_cls.selector_name),) if server_cls.selector_name else ()
    return (server_cls, server_cls.client_cls, *fixed)


def other_declarations() -> list[argparse.Action]:
    """Every flag declared anywhere: by each registered algorithm (by name), selection policy and
    engine, then PFLlib's algorithm flags; for flags declared twice, the first declaration is used
    to check an ignored value."""
    actions = [action for name in ALGORITHMS.names() for action in declared_actions(*_algorithm_classes(ALGORITHMS.get(name)))]
    actions += [action for name in SELECTORS.names() for action in declared_actions(SELECTORS.get(name))]
    actions += [action for name in ENGINES.names() for action in declared_actions(ENGINES.get(name))]
    return actions + list(pfllib_algorithm_actions())


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The generic flags, those of the selected algorithm, selection policy and engine, and every
    other algorithm's (and PFLlib's) flags, accepted and ignored."""
    load_all()
    probe = _probe(argv)
    parser = generic_parser()
    parser.formatter_class = _HelpFormatter
    parser.epilog = (
        "algorithms (-algo) and their own flags; `python main.py -algo NAME -h` documents them:\n"
        + algorithm_flags_text()
        + f"\nmodels (-m): {', '.join(MODELS.names())}"
        + f"\nselection policies (--select, composable with any algorithm): {', '.join(SELECTORS.names())}"
        + f"\ntraining engines (--engine): {', '.join(ENGINES.names())}"
        + "\nevery algorithm flag above and every one of PFLlib's ("
        + " ".join(short for short, *_ in PFLLIB_ALGORITHM_FLAGS)
        + ") is accepted with any -algo; those the selected algorithm does not use are ignored with an info line"
    )
    server_cls = ALGORITHMS.get(probe.algorithm)
    group = parser.add_argument_group(f"{server_cls.registered_name} flags")
    seen: set = set()
    declare_flags(server_cls, group, seen)
    declare_flags(server_cls.client_cls, group, seen)
    select = server_cls.selector_name or probe.select
    declare_flags(SELECTORS.get(select), parser.add_argument_group(f"--select {select} flags"), seen)
    declare_flags(ENGINES.get(probe.engine), parser.add_argument_group(f"--engine {probe.engine} flags"), seen)
    accept_other_flags(parser, other_declarations())
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    setattr(args, IGNORED_DEST, getattr(args, IGNORED_DEST, []))
    server_cls = ALGORITHMS.get(args.algorithm)
    args.algorithm = server_cls.registered_name
    args.select = server_cls.selector_name or args.select
    validate(args)
    return args


def validate(args: argparse.Namespace) -> None:
    """Reject settings that would silently do something else than asked."""
    if not 0 < args.join_ratio <= 1:
        raise FLError(f"-jr must be in (0, 1], got {args.join_ratio}")
    if args.global_rounds < 0:
        raise FLError(f"-gr must be >= 0, got {args.global_rounds}")
    for flag, value in (("-lbs", args.batch_size), ("-ls", args.local_epochs), ("-eg", args.eval_gap), ("-t", args.times)):
        if value < 1:
            raise FLError(f"{flag} must be >= 1, got {value}")
    if args.local_learning_rate <= 0:
        raise FLError(f"-lr must be > 0, got {args.local_learning_rate}")
    if not 0 <= args.client_drop_rate < 1 or not 0 <= args.train_slow_rate <= 1:
        raise FLError("-cdr must be in [0, 1) and -tsr in [0, 1]")
    if args.prev >= args.times:
        raise FLError(f"-pv {args.prev} leaves no run to do with -t {args.times}")
    for flag, value, low in (("-dlgg", args.dlg_gap, 1), ("-bnpc", args.batch_num_per_client, 1),
                             ("--dlg_iters", args.dlg_iters, 1), ("--dlg_clients", args.dlg_clients, 0),
                             ("-nnc", args.num_new_clients, 0), ("-ften", args.fine_tuning_epoch_new, 0)):
        if value < low:
            raise FLError(f"{flag} must be >= {low}, got {value}")
    if args.num_new_clients == 0 and (args.fine_tuning_epoch_new > 0 or args.new_clients_every_eval):
        raise FLError("-ften and --new_clients_every_eval act on new clients: give -nnc N as well")
    unsupported = {
        "-ssr (slow senders)": args.send_slow_rate > 0,
        "-ts/-tth (time-based selection)": args.time_select or args.time_threthold != 10000,
    }
    for name, used in unsupported.items():
        if used:
            raise FLError(f"{name} is not implemented on this platform yet; remove the flag")


def resolve_device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        if not torch.cuda.is_available():
            log.warning("warning: -dev cuda requested but no GPU is available; running on cpu")
            return torch.device("cpu")
        index = int(str(args.device_id).split(",")[0])
        if index >= torch.cuda.device_count():
            raise FLError(f"-did {args.device_id}: only {torch.cuda.device_count()} GPU(s) visible")
        return torch.device(f"cuda:{index}")
    return torch.device("cpu")


def build_model(args: argparse.Namespace, dataset: FederatedDataset, device: torch.device) -> torch.nn.Module:
    factory = MODELS.get(args.model)
    try:
        module = factory(dataset.input_shape, dataset.num_classes, args)
        check_token_ids(args, dataset, module)
        probe = dataset.sample_inputs(2).to("cpu")
        with torch.no_grad():
            module.eval()
            out = module(probe)
            module.train()
    except (ValueError, RuntimeError, IndexError) as exc:
        raise FLError(
            f"model {args.model} does not fit dataset {args.dataset} (inputs {list(dataset.input_shape)}): "
            f"{str(exc).splitlines()[0]}"
        ) from exc
    if out.shape[-1] != dataset.num_classes:
        raise FLError(f"model {args.model} outputs {out.shape[-1]} classes, dataset has {dataset.num_classes}")
    return module


def check_token_ids(args: argparse.Namespace, dataset: FederatedDataset, module: torch.nn.Module) -> None:
    """Integer inputs index the model's embedding table: every id must be in [0, table size), or
    the first batch holding a larger one would stop the run with an indexing error."""
    tables = [m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)]
    inputs = [x for x in (dataset.split("train")[0], dataset.split("test")[0]) if x.numel() and not x.is_floating_point()]
    if not tables or not inputs:
        return
    low, high = min(int(x.min()) for x in inputs), max(int(x.max()) for x in inputs)
    if low < 0 or high >= min(tables):
        raise FLError(
            f"dataset {args.dataset} has token ids {low}..{high}, model {args.model} embeds {min(tables)} tokens "
            f"(-vs {args.vocab_size}); pass -vs {high + 1}"
        )


def setup_logging(quiet: bool) -> None:
    class TqdmHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                from tqdm.auto import tqdm

                stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
                tqdm.write(self.format(record), file=stream)
            except Exception:  # pragma: no cover - never let logging kill a run
                self.handleError(record)

    logger = logging.getLogger("fl")
    logger.handlers[:] = [TqdmHandler()]
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False


def run(args: argparse.Namespace) -> list[Path]:
    """Run ``-t`` repeats of the experiment; returns the result files written."""
    setup_logging(args.quiet)
    if getattr(args, IGNORED_DEST, None):
        log.info("%s does not use %s: ignored", args.algorithm, ", ".join(getattr(args, IGNORED_DEST)))
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    device = resolve_device(args)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            dataset = load_federated_dataset(
                args.dataset, device, data_root=args.data_root,
                num_clients=None if args.num_new_clients else args.num_clients,  # hold_out checks -nc then
                legacy_pickle=args.legacy_pickle, few_shot=args.few_shot, compact=args.compact_inputs,
            )
    for w in caught:
        log.warning("warning: %s", w.message)
    if args.num_classes is not None and args.num_classes != dataset.num_classes:
        raise FLError(
            f"-ncl {args.num_classes} does not match dataset {args.dataset!r} ({dataset.num_classes} classes); drop -ncl"
        )
    dataset, new_clients = hold_out(dataset, args.num_new_clients, args.num_clients)
    args.num_clients, args.num_classes = len(dataset.clients), dataset.num_classes
    server_cls = ALGORITHMS.get(args.algorithm)
    paths: list[Path] = []
    best: list[float] = []
    for run_index in range(args.prev, args.times):
        run_args = copy.copy(args)
        run_args.seed = args.seed + run_index
        seed_everything(derive_seed(run_args.seed, "init"))
        module = build_model(run_args, dataset, device)
        server = server_cls(run_args, dataset, module, device)
        log.info(
            "run %d/%d: %s on %s, %d clients, model %s (%d parameters), device %s %s",
            run_index + 1, args.times, args.algorithm, args.dataset, len(server.clients), args.model,
            server.model.num_params, device, json.dumps(server.summary()) if server.summary() else "",
        )
        started = time.perf_counter()
        path = result_path(args.dataset, args.algorithm, args.goal, run_index, args.results_dir)
        history = server.train(progress=args.progress and not args.quiet,
                               callbacks=evaluation_callbacks(server, new_clients, path))
        model_bytes = server.global_params.numel() * server.global_params.element_size()
        summary = summarize(history, args.avg_last, args.target_acc, model_bytes)
        summary.update(peak_rss_mb=peak_rss_mb(), wall_time_s=time.perf_counter() - started)
        summary.update(evaluation_summary(history))
        gpu = peak_gpu_mb(device)
        if gpu is not None:
            summary["peak_gpu_mb"] = gpu
        attrs = {
            "algorithm": args.algorithm, "dataset": Path(args.dataset).name, "goal": args.goal,
            "run": run_index, "seed": run_args.seed, "model": args.model, "device": str(device),
            "config": json.dumps(vars(run_args), default=str), "torch_version": torch.__version__,
        }
        path = save_results(path, history, attrs, summary)
        paths.append(path)
        if args.save_model:
            save_model(server, args)
        server.close()
        best.append(summary["best_acc"])
        print_summary(run_index, summary, path)
    if len(best) > 1:
        print(f"Best accuracy over {len(best)} runs: mean {np.mean(best):.4f}, std {np.std(best):.4f}")
    return paths


def evaluation_callbacks(server, new_clients: FederatedDataset | None, path: Path) -> list:
    """The round callbacks that evaluate more than accuracy: the DLG attack (``-dlg``; pictures
    next to the result file) and the held-out new clients (``-nnc``)."""
    callbacks: list = []
    if server.args.dlg_eval:
        callbacks.append(DLGAttack(server, path.with_suffix("")))
    if new_clients is not None:
        callbacks.append(NewClientEvaluation(server, new_clients))
    return callbacks


def evaluation_summary(history) -> dict[str, float]:
    """The new clients' final accuracy and the attack's mean PSNR/SSIM, when the run has them."""
    series = history.extra_series
    summary = {}
    if series.get("new_client_acc"):
        summary.update(new_client_acc=float(series["new_client_acc"][-1]), new_client_auc=float(series["new_client_auc"][-1]))
    if series.get("dlg_psnr"):
        ssim = [v for v in series["dlg_ssim"] if np.isfinite(v)]  # NaN for inputs that are not images
        summary.update(dlg_psnr_mean=float(np.mean(series["dlg_psnr"])),
                       dlg_ssim_mean=float(np.mean(ssim)) if ssim else float("nan"))
    return summary


def save_model(server, args: argparse.Namespace) -> None:
    folder = Path(__file__).resolve().parent / "models" / Path(args.dataset).name
    folder.mkdir(parents=True, exist_ok=True)
    server.model.load(server.global_params)
    torch.save(server.model.module.state_dict(), folder / f"{args.algorithm}_server.pt")


def print_summary(run_index: int, summary: dict, path: Path) -> None:
    lines = [
        f"Run {run_index}: best accuracy {summary['best_acc']:.4f}, final {summary['final_acc']:.4f}, "
        f"mean of last 10% {summary['mean_acc_last_10pct']:.4f}, mean of last {summary['avg_last']} "
        f"{summary['mean_acc_last_n']:.4f}",
        f"  time {summary['wall_time_s']:.1f} s ({summary['mean_round_time'] or 0:.3f} s/round), "
        f"peak RSS {summary['peak_rss_mb']:.0f} MB"
        + (f", peak GPU {summary['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in summary else "")
        + f", uploaded {summary['total_bytes_up'] / 1e6:.1f} MB",
    ]
    if "new_client_acc" in summary:
        lines.append(f"  new clients: accuracy {summary['new_client_acc']:.4f}, auc {summary['new_client_auc']:.4f}")
    if "dlg_psnr_mean" in summary:
        lines.append(f"  DLG attack: mean PSNR {summary['dlg_psnr_mean']:.2f} dB, SSIM {summary['dlg_ssim_mean']:.3f}")
    if "target_acc" in summary:
        if summary["rounds_to_target"] is None:
            lines.append(f"  target accuracy {summary['target_acc']} not reached")
        else:
            lines.append(
                f"  target {summary['target_acc']} reached at round {summary['rounds_to_target']} after "
                f"{summary['uploads_to_target']:.1f} model uploads ({summary['bytes_up_to_target'] / 1e6:.1f} MB)"
            )
    lines.append(f"  results: {path}")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except FLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except torch.cuda.OutOfMemoryError:
        print("error: the GPU ran out of memory; lower -lbs or --eval_batch_size, or use -dev cpu", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: no result file was written for the unfinished run", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
