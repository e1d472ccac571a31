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
import os
import re
import sys
import warnings
from pathlib import Path

try:  # the libraries take seconds to load: a Ctrl-C meanwhile ends quietly, as one later does
    import numpy as np
    import torch

    from flcore.features import features, incompatibility, split_for_features, wanted_plugins
    from flcore.registry import ALGORITHMS, ENGINES, MODELS, SELECTORS, load_all
    from runner.checks import validate_with_data, warn_degenerate
    from runner.device import configure_backends, resolve_device, setup_logging
    from runner.model import build_model
    from runner.results import SAVE_MODEL_NEEDS_SAFETENSORS, model_paths, print_summary, staging_name, train_one
    from cli.flags import (IGNORED_DEST, PFLLIB_ALGORITHM_FLAGS, SEED_HIGH, accept_other_flags, check_ranges,
                           declare_flags, declared_actions, generic_parser, pfllib_algorithm_actions)
    from cli.config_file import expand_config
    from fldata.loading import load_federated_dataset
    from fldata.public import public_data_needed, with_public_data
    from utils.errors import FLError
    from reporting.results import read_results, result_path
    from utils.interrupts import EXIT_STATUS, INTERRUPTS
    from runner.run_control import Claim, RunInterrupted, claim_all, file_identity, interrupted_message, is_finished
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
    for feature in features():  # every run has every feature's flags: they decide whether it is wanted
        declare_flags(feature, parser.add_argument_group(feature.flag_group or feature.registered_name), seen)
    accept_other_flags(parser, other_declarations())
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # --config FILE.toml: the file's [flags] first, so that the command line's override them
    argv = expand_config(list(sys.argv[1:] if argv is None else argv), build_parser)
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
#: generators (dataset/datagen) take the same range (cli/flags.py declares it with --seed).
MAX_SEED = SEED_HIGH
def validate(args: argparse.Namespace) -> None:
    """Reject settings that would silently do something else than asked (before any data is read);
    each flag's own range is declared with it (``add_flag(..., low=...)``) and checked before."""
    if args.prev >= args.times:
        raise FLError(f"-pv {args.prev} leaves no run to do with -t {args.times}")
    if args.seed + args.times - 1 > MAX_SEED:  # run i takes seed + i
        raise FLError(f"--seed {args.seed} with -t {args.times} runs seeds past {MAX_SEED}; "
                      f"pass --seed {MAX_SEED - args.times + 1} or less")
    validate_names(args)
    for feature in features():  # flags that contradict each other or lack the feature they belong to
        feature.check(args)
    reason = incompatibility(args, ALGORITHMS.get(args.algorithm))
    if reason:
        raise FLError(reason)
    validate_public_data(args)
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
    while not os.path.exists(folder) and folder != folder.parent:  # (False, not an error, for a too long name)
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


def validate_public_data(args: argparse.Namespace) -> None:
    """An algorithm or plug-in that needs the server's public data, without ``--public_data``; and
    ``--public_data`` where nothing uses it: its rows would leave the clients' training data for
    nothing (a weaker baseline), unless ``--public_data_withhold`` asks for exactly that."""
    users = [ALGORITHMS.get(args.algorithm).public_data_user(args),
             *(cls.public_data_user(args) for cls in wanted_plugins(args))]
    user = next((u for u in users if u), None)
    if args.public_data is None and user:
        raise public_data_needed(user)
    if args.public_data is not None and not user and not args.public_data_withhold:
        raise FLError(f"--public_data: neither {args.algorithm} nor an option of this run uses a public set, and "
                      "drawing one takes its rows from the clients' training data; drop it, or pass "
                      "--public_data_withhold to withhold the same rows on purpose (equal data across a comparison)")


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
    before = {held.result: file_identity(held.result) for held in claims}
    try:
        return run_claimed(args, dict(zip(runs, claims)))
    except KeyboardInterrupt as exc:  # what the interrupted invocation did write, for its message
        exc.written = [(path, is_finished(path)) for path, was in before.items() if file_identity(path) != was]
        finished = {path for path, done in exc.written if done}
        exc.complete = all(held.action == "skip" or held.result in finished for held in claims)
        raise
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
                # a feature that holds clients out (-nnc) checks -nc against what it leaves
                num_clients=None if any(cls.takes_clients(args) for cls in wanted_plugins(args)) else args.num_clients,
                legacy_pickle=args.legacy_pickle, few_shot=args.few_shot, compact=args.compact_inputs,
            )
    for w in caught:
        log.warning("warning: %s", w.message)
    if args.num_classes is not None and args.num_classes != dataset.num_classes:
        raise FLError(
            f"-ncl {args.num_classes} does not match dataset {args.dataset!r} ({dataset.num_classes} classes); drop -ncl"
        )
    dataset = split_for_features(args, dataset)  # before the public set is drawn from the training pool
    dataset = with_public_data(args, dataset)  # --public_data: the server's public set (fldata/public.py)
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
            for feature in wanted_plugins(args):
                for line in feature.warnings(args, server_cls):
                    log.warning(line)
        log.info(
            "run %d/%d: %s on %s, %d clients, model %s (%d parameters), device %s %s",
            run_index + 1, args.times, args.algorithm, args.dataset, len(server.clients), args.model,
            server.model.num_params, device, json.dumps(server.summary()) if server.summary() else "",
        )
        for name, plugin in server.plugins.items():  # attacks, defences, stragglers: what the run faces
            if plugin.summary():
                log.info("  %s: %s", name, json.dumps(plugin.summary(), default=str))
        try:
            summary, path = train_one(server, run_args, run_index, claimed, device)
        finally:
            server.close()
        paths.append(path)
        best.append(summary["best_acc"])
        print_summary(run_index, summary, path, server.plugins.values())
    if len(best) > 1:
        print(f"Best accuracy over {len(best)} runs: mean {np.mean(best):.4f}, std {np.std(best):.4f}")
    return paths


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
        print(interrupted_message(exc), file=sys.stderr)
        return getattr(exc, "exit_status", 130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
