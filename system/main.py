"""Run a federated-learning experiment: ``python main.py -data MNIST -m CNN -algo FedAvg -gr 2000 -did 0``.

The command line is PFLlib's (see ``python main.py -h``). ``-algo`` and ``-m`` are looked up in
registries; each algorithm declares its own flags, added here only for the selected algorithm.
Results go to ``results/<data>_<algo>_<goal>_<run>.h5``; anything the user can fix is reported
as one line on stderr with exit status 2.
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a Ctrl-C during the seconds of imports is never lost (utils/interrupts.py)
    from utils.interrupts import INTERRUPTS

    INTERRUPTS.install()

import argparse
import copy
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import sys
import time
import warnings
from pathlib import Path

try:  # the libraries take seconds to load: a Ctrl-C meanwhile ends quietly, as one later does
    import numpy as np
    import torch

    from flcore.attacks.dlg import DLGAttack
    from flcore.newclients import NewClientEvaluation, hold_out
    from flcore.plugins import wanted_plugins
    from flcore.privacy.server import privacy_lines, privacy_summary
    from flcore.registry import ALGORITHMS, ENGINES, MODELS, SELECTORS, load_all
    from flcore.trainmodel.checks import dry_run
    from utils.cli import (IGNORED_DEST, PFLLIB_ALGORITHM_FLAGS, PFLLIB_VOCAB_SIZE, SEED_HIGH, accept_other_flags, check_ranges,
                           declare_flags, declared_actions, generic_parser, pfllib_algorithm_actions)
    from utils.data_utils import FederatedDataset, load_federated_dataset
    from utils.public_data import public_data_needed, with_public_data
    from utils.checkpoint import load_checkpoint, load_server_state, save_checkpoint, server_state
    from utils.errors import Diverged, FLError
    from utils.live import live_callbacks
    from utils.allocator import keep_freed_memory
    from utils.mem_utils import peak_gpu_mb, peak_rss_mb
    from utils.result_utils import read_results, result_path, save_results, summarize, write_atomically
    from utils.interrupts import EXIT_STATUS, INTERRUPTS
    from utils.run_control import Claim, RunInterrupted, StopOnSignal, claim_all, is_finished
    from utils.seeding import derive_seed, seed_everything
except KeyboardInterrupt as exc:
    raise SystemExit(getattr(exc, "exit_status", 130)) from None

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
    check_ranges(parser, args)  # the range every flag declares: generic, algorithm, policy and engine flags
    validate(args)
    return args


#: utils.seeding keeps 32 bits of a seed: -1 would be 4294967295's run under another name. The
#: generators (dataset/datagen) take the same range (utils/cli.py declares it with --seed).
MAX_SEED = SEED_HIGH
#: the model is written after the last round, so a missing package is refused before the first
SAVE_MODEL_NEEDS_SAFETENSORS = ("--save_model (on by default) needs the safetensors package: "
                                "pip install -r requirements.txt, or pass --save_model False")


def validate(args: argparse.Namespace) -> None:
    """Reject settings that would silently do something else than asked (before any data is read);
    each flag's own range is declared with it (``add_flag(..., low=...)``) and checked before."""
    if args.prev >= args.times:
        raise FLError(f"-pv {args.prev} leaves no run to do with -t {args.times}")
    if args.seed + args.times - 1 > MAX_SEED:  # run i takes seed + i
        raise FLError(f"--seed {args.seed} with -t {args.times} runs seeds past {MAX_SEED}; "
                      f"pass --seed {MAX_SEED - args.times + 1} or less")
    validate_names(args)
    validate_privacy(args)
    validate_public_data(args)
    if args.num_new_clients == 0 and (args.fine_tuning_epoch_new > 0 or args.new_clients_every_eval):
        raise FLError("-ften and --new_clients_every_eval act on new clients: give -nnc N as well")
    if args.client_trace is not None and not Path(args.client_trace).is_file():
        raise FLError(f"--client_trace {args.client_trace}: no such file")
    if args.save_model and importlib.util.find_spec("safetensors") is None:
        raise FLError(SAVE_MODEL_NEEDS_SAFETENSORS)  # now, not after the last round, when it would cost the run


#: what a goal (-go) may hold: it becomes part of file names (sweep.py applies the same rule)
PLAIN_NAME = re.compile(r"[A-Za-z0-9._+=-]+")


def validate_names(args: argparse.Namespace) -> None:
    """The parts of the result file's name that come from the user: the goal and the dataset folder's
    name (``results/<data>_<algo>_<goal>_<run>.h5``) must be plain names, so that a result stays in
    --results_dir, is not hidden, and is found again by summarize.py, plot.py and sweep.py."""
    if not PLAIN_NAME.fullmatch(args.goal):
        raise FLError(f"-go {args.goal!r}: use letters, digits and . _ + = - only, at least one "
                      "(it is part of the result file names)")
    name = Path(args.dataset).name
    if not name or name in (".", "..") or name.startswith(".") or any(ord(c) < 32 for c in name):
        raise FLError(f"-data {args.dataset!r}: the result file names start with the dataset folder's name, and "
                      f"{name!r} is not a plain one; pass the folder by a path that ends in its name "
                      "(e.g. -data ../MNIST)")
    # the longest file name a run writes: the temporary file of its staged personal models,
    # "..<data>_<algo>_<goal>_<run>.personal.safetensors.new.<8 random characters>.tmp"
    result = result_path(args.dataset, args.algorithm, args.goal, args.times - 1, args.results_dir)
    longest = len(os.fsencode(f"..{result.stem}.personal.safetensors.new.XXXXXXXX.tmp"))
    folder = result.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255  # POSIX's usual NAME_MAX
    room = limit - (longest - len(args.goal))
    if room < 1:
        raise FLError(f"-data {args.dataset!r}: the folder's name is too long to name result files ({limit} bytes "
                      f"at most in {folder}); pass the dataset by a folder (or a symbolic link) of a shorter name")
    if longest > limit:
        raise FLError(f"-go is {len(args.goal)} characters, too long for the file names of a run ({limit} bytes "
                      f"at most in {folder}, with -data, -algo and the run number); pass a -go of at most {room}")


def validate_with_data(args: argparse.Namespace, dataset: FederatedDataset) -> None:
    """The checks that need the dataset: samples to train on and to evaluate, a cohort of at least
    one client, and clients that train.

    Clients that take no local step (fewer training samples than -lbs with --drop_last, or none)
    are named in one warning; a run in which no client would take a step is refused."""
    clients = len(dataset.clients)
    if math.floor(clients * args.join_ratio + 1e-9) < 1:  # the cohort size of utils' uniform selection
        smallest = math.ceil(10_000 / clients) / 10_000
        raise FLError(f"-jr {args.join_ratio} selects no client of {clients} (floor({clients} x {args.join_ratio}) = 0); "
                      f"pass -jr {smallest:g} or more")
    for split in ("train", "test"):
        if not len(dataset.split(split)[1]):
            raise FLError(f"no client of dataset {args.dataset} has {split} samples ({dataset.path / split}); "
                          "regenerate the dataset")
    sizes = [client.num_train for client in dataset.clients]
    idle = [c.cid for c, n in zip(dataset.clients, sizes) if n == 0 or (args.drop_last and n < args.batch_size)]
    if len(idle) == clients:
        raise FLError(f"-lbs {args.batch_size} is larger than every client's training set (largest: {max(sizes)} "
                      f"samples) and --drop_last skips the partial batch, so no client would train; "
                      f"pass -lbs {max(sizes)} or less, or --drop_last False")
    if idle:
        named = ", ".join(map(str, idle[:5])) + (f" and {len(idle) - 5} more" if len(idle) > 5 else "")
        reason = f"fewer training samples than -lbs {args.batch_size}, with --drop_last" if args.drop_last else "no training samples"
        log.warning("warning: %d of %d clients take no local step (%s): %s", len(idle), clients, reason, named)


def validate_public_data(args: argparse.Namespace) -> None:
    """An algorithm or plug-in that needs the server's public data, without ``--public_data``."""
    if getattr(args, "public_data", None) is not None:
        return
    users = [ALGORITHMS.get(args.algorithm).public_data_user(args),
             *(cls.public_data_user(args) for cls in wanted_plugins(args))]
    user = next((u for u in users if u), None)
    if user:
        raise public_data_needed(user)


def validate_privacy(args: argparse.Namespace) -> None:
    """DP noise given without the mechanism it belongs to (the ranges are declared with the flags)."""
    if args.dp_sigma > 0 and not args.privacy:
        raise FLError("-dps sets DP-SGD's noise, which needs -dp (DP-SGD) to be on")
    if args.dp_server_sigma > 0 and args.dp_update_clip <= 0:
        raise FLError("--dp_server_sigma sets DP-FedAvg's noise, which needs --dp_update_clip > 0 (DP-FedAvg) to be on")


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


def configure_backends(args: argparse.Namespace, device: torch.device) -> None:
    """Process-wide switches the flags ask for, before any data or model is made: where glibc keeps
    freed memory (``--malloc_keep_freed``, so their temporaries reuse it) and, on ``device``, cuDNN's
    timed algorithm choice (``--cudnn_benchmark``)."""
    keep_freed_memory(args.malloc_keep_freed)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)


def build_model(args: argparse.Namespace, dataset: FederatedDataset, device: torch.device) -> torch.nn.Module:
    factory = MODELS.get(args.model)
    model_args = with_vocab_size(args, dataset)
    try:
        module = factory(dataset.input_shape, dataset.num_classes, model_args)
        check_token_ids(model_args, dataset, module)
        out = dry_run(module, dataset.sample_inputs(2).to("cpu"))  # before training: a shape it cannot take
    except (ValueError, RuntimeError, IndexError) as exc:
        raise FLError(
            f"model {args.model} does not fit dataset {args.dataset} (inputs {list(dataset.input_shape)}): "
            f"{str(exc).splitlines()[0]}"
        ) from exc
    if out.shape[-1] != dataset.num_classes:
        raise FLError(f"model {args.model} outputs {out.shape[-1]} classes, dataset has {dataset.num_classes}")
    return module


def with_vocab_size(args: argparse.Namespace, dataset: FederatedDataset) -> argparse.Namespace:
    """The arguments a model is built with. Without -vs, text models get the vocabulary the generator
    recorded in config.json (token ids 0..vocab_size-1), and PFLlib's 80 for folders without one
    (PFLlib's own, converted ones). ``args`` keeps -vs unset, so the settings a result file records
    (and a resume or a sweep compares) are the ones the user gave."""
    if args.vocab_size is not None:
        return args
    recorded = dataset.config.get("vocab_size", PFLLIB_VOCAB_SIZE)
    if isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 1:
        raise FLError(f"dataset {args.dataset}: config.json's vocab_size {recorded!r} is not a positive integer; pass -vs")
    model_args = copy.copy(args)
    model_args.vocab_size = recorded
    return model_args


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
    runs = range(args.prev, args.times)
    # claimed before anything is loaded: a refusal costs nothing, and no other run can take the names
    claims = claim_all([result_path(args.dataset, args.algorithm, args.goal, i, args.results_dir) for i in runs],
                       args.overwrite, args.resume)
    for held in claims:  # files a run killed while committing left (the lock says no run writes them now)
        for path in (held.result, *model_paths(held.result)):
            staging_name(path).unlink(missing_ok=True)
    try:
        return run_claimed(args, dict(zip(runs, claims)))
    finally:
        for held in claims:
            held.release()


def run_claimed(args: argparse.Namespace, claims: dict[int, Claim]) -> list[Path]:
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    device = resolve_device(args)
    configure_backends(args, device)
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
    dataset = with_public_data(args, dataset)  # --public_data: the server's public set (utils/public_data.py)
    validate_with_data(args, dataset)
    args.num_clients, args.num_classes = len(dataset.clients), dataset.num_classes
    server_cls = ALGORITHMS.get(args.algorithm)
    paths: list[Path] = []
    best: list[float] = []
    for run_index, claimed in claims.items():
        if claimed.action == "skip":
            print(f"Run {run_index}: already finished ({claimed.result}); skipped (--resume)")
            paths.append(claimed.result)
            earlier = np.asarray(read_results(claimed.result).get("rs_test_acc", []))
            if earlier.size:  # it counts in the best accuracy over the runs
                best.append(float(earlier.max()))
            continue
        run_args = copy.copy(args)
        run_args.seed = args.seed + run_index
        seed_everything(derive_seed(run_args.seed, "init"))
        module = build_model(run_args, dataset, device)
        server = server_cls(run_args, dataset, module, device)
        if not paths:  # once, at the start of the first run trained
            warn_degenerate(args, server)
        log.info(
            "run %d/%d: %s on %s, %d clients, model %s (%d parameters), device %s %s",
            run_index + 1, args.times, args.algorithm, args.dataset, len(server.clients), args.model,
            server.model.num_params, device, json.dumps(server.summary()) if server.summary() else "",
        )
        for name, plugin in server.plugins.items():  # attacks, defences, stragglers: what the run faces
            if plugin.summary():
                log.info("  %s: %s", name, json.dumps(plugin.summary(), default=str))
        try:
            summary, path = train_one(server, run_args, run_index, claimed, device, new_clients)
        finally:
            server.close()
        paths.append(path)
        best.append(summary["best_acc"])
        print_summary(run_index, summary, path)
    if len(best) > 1:
        print(f"Best accuracy over {len(best)} runs: mean {np.mean(best):.4f}, std {np.std(best):.4f}")
    return paths


#: each named split of the model (``Server.shared``): (the shared part, the private part), in words
MODEL_SPLITS = {"body": ("the body", "the head"), "head": ("the head", "the body"),
                "no_norm": ("all but the normalisation layers", "the normalisation layers"),
                "no_batchnorm": ("all but the BatchNorm layers", "the BatchNorm layers")}


def warn_degenerate(args: argparse.Namespace, server) -> None:
    """One warning line for each setting under which the method asked for is another one: a split
    of the model whose private or shared part is empty with this model (FedBN on a model without
    normalisation layers is FedAvg, FedPer or FedRep on MLR, which has no body, is Local), and
    differential privacy without noise (epsilon is infinite)."""
    parts = server.shared_parts()
    body = getattr(server.model.module, "body", None)
    if getattr(server, "learns_from_features", False) and body is not None and not any(
            p.numel() for p in body.parameters()):
        # the split is not what degenerates (FedGH on MLR is no FedAvg): the representation is
        log.warning("warning: %s learns from the features of the model's body, and model %s's body has no "
                    "parameters: its features are the inputs themselves; use a model with a feature extractor "
                    "(e.g. DNN or CNN)", args.algorithm, args.model)
    elif isinstance(parts, str) and parts in MODEL_SPLITS:
        shared, private = MODEL_SPLITS[parts]
        if server.shared_mask is None:
            log.warning("warning: %s keeps %s on the clients, and model %s has none: every parameter is shared, "
                        "so this run is FedAvg", args.algorithm, private, args.model)
        elif not bool(server.shared_mask.any()):
            log.warning("warning: %s shares %s, and model %s has none: no parameter is shared, so this run is "
                        "Local", args.algorithm, shared, args.model)
    if args.privacy and args.dp_sigma == 0:
        log.warning("warning: -dp with -dps 0 (PFLlib's default) clips but adds no noise: epsilon is infinite, "
                    "no privacy; pass -dps > 0 (e.g. 1.0)")
    if args.dp_update_clip > 0 and args.dp_server_sigma == 0:
        log.warning("warning: --dp_update_clip without --dp_server_sigma clips the updates but adds no noise: "
                    "epsilon is infinite, no user-level privacy; pass --dp_server_sigma > 0")


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


def train_one(server, run_args: argparse.Namespace, run_index: int, claimed: Claim,
              device: torch.device, new_clients: FederatedDataset | None = None) -> tuple[dict, Path]:
    """Train one run (from its checkpoint with --resume) and write its results; an interruption
    or divergence still writes the results so far, marked unfinished. ``new_clients``: the
    clients ``-nnc`` holds out, evaluated apart."""
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
        summary = summarize(history, run_args.avg_last, run_args.target_acc, model_bytes)
        summary.update(peak_rss_mb=peak_rss_mb(), wall_time_s=run_time())
        summary.update(evaluation_summary(history))
        summary.update(privacy_summary(history, run_args))  # final epsilon of a DP run
        gpu = peak_gpu_mb(device)
        if gpu is not None:
            summary["peak_gpu_mb"] = gpu
        attrs = {
            "algorithm": run_args.algorithm, "dataset": Path(run_args.dataset).name, "goal": run_args.goal,
            "run": run_index, "seed": run_args.seed, "model": run_args.model, "device": str(device),
            "config": json.dumps(vars(run_args), default=str), "torch_version": torch.__version__,
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

    try:
        with StopOnSignal() as stop:
            server.train(progress=run_args.progress and not run_args.quiet, start_round=start_round,
                         round_end=round_end,
                         callbacks=[*evaluation_callbacks(server, new_clients, claimed.result), *live_callbacks(run_args, run_index)])
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
                + (f", {summary['virtual_time_to_target']:.1f} virtual s" if "virtual_time_to_target" in summary else "")
            )
    if "staleness_histogram" in summary:
        lines.append(f"  staleness histogram (uploads aggregated 0, 1, ... rounds late): {summary['staleness_histogram']}")
    lines += privacy_lines(summary)
    lines.append(f"  results: {path}")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    try:
        with INTERRUPTS:
            run(parse_args(argv))
            if INTERRUPTS.pending is not None:  # its KeyboardInterrupt was swallowed (a finalizer) at the very end
                print("interrupted after the results were written: they are complete", file=sys.stderr)
                return EXIT_STATUS[INTERRUPTS.pending]
    except FLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except torch.cuda.OutOfMemoryError:
        print("error: the GPU ran out of memory; lower -lbs or --eval_batch_size, or use -dev cpu", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        return exc.exit_status
    except KeyboardInterrupt as exc:
        print("interrupted: no result file was written for the unfinished run", file=sys.stderr)
        return getattr(exc, "exit_status", 130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
