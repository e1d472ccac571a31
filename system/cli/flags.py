"""Command-line flags of ``main.py``: PFLlib's names and defaults, booleans that switch both ways.

Every long PFLlib flag (``--global_rounds``) also accepts the dashed spelling
(``--global-rounds``). PFLlib declares booleans with ``type=bool``, so ``-ab False`` turns
auto-break *on*; here ``-ab``, ``-ab True`` and ``-ab 1`` turn it on and ``-ab False`` /
``-ab 0`` off.

Algorithm flags are declared by each algorithm file (``add_args``); ``main.py`` declares those of
the selected algorithm, selection policy and engine with their types and defaults. As PFLlib's one
parser knows every flag whatever ``-algo`` is, the flags of every other registered algorithm,
policy and engine and PFLlib's own algorithm flags (:data:`PFLLIB_ALGORITHM_FLAGS`) are accepted
too and ignored (:func:`accept_other_flags`). Tokens are matched exactly (:class:`ExactParser`):
``-mu`` is never ``-m u`` and ``--glob`` never ``--global_rounds``.

An algorithm reads its own flags as typed, frozen attributes (:func:`hyperparameters`), built
from the same ``add_args`` declarations.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import typing
from typing import Any, Iterable

from utils.errors import FLError
from utils.live import tensorboard_dir


def str2bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in {"1", "true", "t", "yes", "y", "on"}:
        return True
    if lowered in {"0", "false", "f", "no", "n", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False/1/0), got {value!r}")


@dataclasses.dataclass(frozen=True)
class Allowed:
    """The values a numeric flag accepts: ``low <= v`` / ``above < v`` and ``v <= high`` / ``v < below``
    (None: unbounded on that side), finite unless ``finite=False``. NaN is never allowed."""

    low: float | None = None
    above: float | None = None
    high: float | None = None
    below: float | None = None
    finite: bool = True
    whole: bool = False  # an int flag: its one-sided range reads ">= 1", a float's "a finite number > 0"

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and (math.isnan(value) or (self.finite and math.isinf(value))):
            return False
        return ((self.low is None or value >= self.low) and (self.above is None or value > self.above)
                and (self.high is None or value <= self.high) and (self.below is None or value < self.below))

    def describe(self) -> str:
        def shown(bound: float) -> str:  # whole numbers in full (a seed's 4294967295, not 4.29497e+09)
            return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"

        lower = (f"[{shown(self.low)}" if self.low is not None else f"({shown(self.above)}" if self.above is not None else None)
        upper = (f"{shown(self.high)}]" if self.high is not None else f"{shown(self.below)})" if self.below is not None else None)
        if lower and upper:
            return f"in {lower}, {upper}"
        number = "" if self.whole or not self.finite else "a finite number "
        if lower:
            return number + (">= " if lower[0] == "[" else "> ") + lower[1:]
        if upper:
            return number + ("<= " if upper[-1] == "]" else "< ") + upper[:-1]
        return "a finite number"


#: the keywords of :func:`add_flag` that declare a flag's range (see :class:`Allowed`)
RANGE_KEYWORDS = ("low", "above", "high", "below", "finite")


def add_flag(parser: argparse.ArgumentParser | Any, *names: str, **kwargs: Any) -> argparse.Action:
    """``add_argument`` that also registers ``--dashed-name`` for each ``--underscored_name``.

    A numeric flag declares the values it accepts with ``low=`` (>=), ``above=`` (>), ``high=`` (<=),
    ``below=`` (<) and ``finite=`` (default True: inf refused; NaN always is). ``main.py`` checks
    every declared range once, before any work (:func:`check_ranges`)."""
    spellings = list(names)
    for name in names:
        if name.startswith("--") and "_" in name:
            dashed = name.replace("_", "-")
            if dashed not in spellings:
                spellings.append(dashed)
    bounds = {key: kwargs.pop(key) for key in RANGE_KEYWORDS if key in kwargs}
    if bounds:
        bounds["whole"] = kwargs.get("type") is int
    if bounds and kwargs.get("help"):
        kwargs["help"] += f"; {Allowed(**bounds).describe()}"
    if kwargs.get("type") is bool:
        kwargs.update(type=str2bool, nargs="?", const=True, metavar="BOOL")
    action = parser.add_argument(*spellings, **kwargs)
    if bounds:
        if kwargs.get("type") not in (int, float):
            raise TypeError(f"{names[0]}: a range needs type=int or type=float")
        action.allowed = Allowed(**bounds)
    return action


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One line naming the flag, its value and its range for the first parsed value outside the
    range its declaration gives (None: left unset, allowed)."""
    for action in parser._actions:
        allowed = getattr(action, "allowed", None)
        value = getattr(args, action.dest, None)
        if allowed is None or value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if not allowed.admits(item):
                raise FLError(f"{action.option_strings[0]} must be {allowed.describe()}, got {item}")


class ExactParser(argparse.ArgumentParser):
    """An ArgumentParser that takes a token as a flag only when it is one, or ``flag=value``.

    argparse keeps two guesses even with ``allow_abbrev=False``: a single-dash token that is not a
    flag is split into a short flag and its value (``-mu 0.1`` is ``-m u`` followed by a stray
    ``0.1``, ``-tau 1.0`` is ``-t au``), and unknown prefixes are looked up among the flags. With
    PFLlib's many short flags either guess turns a typo or another algorithm's flag into a
    different setting, so both are switched off here (``_get_option_tuples`` is where argparse
    makes them, in every Python version we support)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list:
        return []

    def error(self, message: str) -> typing.NoReturn:
        """One line on stderr and exit status 2, like every other input error (no usage dump)."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} -h` lists the flags)\n")


class _SameAs(argparse.Action):
    """Another spelling of a declared flag: parsed with that flag's type and stored through it."""

    def __init__(self, option_strings: list[str], dest: str, target: argparse.Action, **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.target = target

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        self.target(parser, namespace, values, option_string)


class _Ignored(argparse.Action):
    """A flag of another algorithm (or of PFLlib's): its value is checked, then only its name is kept,
    in ``args.ignored_flags``, for the one info line of the run."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        seen = list(getattr(namespace, IGNORED_DEST, None) or [])
        if option_string not in seen:
            seen.append(option_string)
        setattr(namespace, IGNORED_DEST, seen)


#: PFLlib's -vs default (Shakespeare's 80 characters); used when neither -vs nor config.json gives one
PFLLIB_VOCAB_SIZE = 80
#: the largest seed: utils.seeding keeps 32 bits (the generators take the same range)
SEED_HIGH = 2**32 - 1

#: where the parsed namespace lists the given flags that the selected algorithm does not use
IGNORED_DEST = "ignored_flags"

#: PFLlib's algorithm-specific flags with its types and defaults (``../shared/specs/pfllib-cli.md``):
#: PFLlib's parser knows them whatever ``-algo`` is, so scripts pass them along with any algorithm.
#: An algorithm here that uses one declares it itself (possibly with its own default).
PFLLIB_ALGORITHM_FLAGS: tuple[tuple[str, str, type, Any], ...] = (
    ("-bt", "--beta", float, 0.0),
    ("-lam", "--lamda", float, 1.0),
    ("-mu", "--mu", float, 0.0),
    ("-K", "--K", int, 5),
    ("-lrp", "--p_learning_rate", float, 0.01),
    ("-M", "--M", int, 5),
    ("-itk", "--itk", int, 4000),
    ("-alk", "--alphaK", float, 1.0),
    ("-sg", "--sigma", float, 1.0),
    ("-al", "--alpha", float, 1.0),
    ("-pls", "--plocal_epochs", int, 1),
    ("-tau", "--tau", float, 1.0),
    ("-fte", "--fine_tuning_epochs", int, 10),
    ("-dlr", "--dr_learning_rate", float, 0.0),
    ("-L", "--L", float, 1.0),
    ("-nd", "--noise_dim", int, 512),
    ("-glr", "--generator_learning_rate", float, 0.005),
    ("-hd", "--hidden_dim", int, 512),
    ("-se", "--server_epochs", int, 1000),
    ("-lf", "--localize_feature_extractor", bool, False),
    ("-slr", "--server_learning_rate", float, 1.0),
    ("-et", "--eta", float, 1.0),
    ("-s", "--rand_percent", int, 80),
    ("-p", "--layer_idx", int, 2),
    ("-mlr", "--mentee_learning_rate", float, 0.005),
    ("-Ts", "--T_start", float, 0.95),
    ("-Te", "--T_end", float, 0.98),
    ("-mo", "--momentum", float, 0.1),
    ("-klw", "--kl_weight", float, 0.0),
    ("-fsb", "--first_stage_bound", int, 0),
    ("-ca", "--fedcross_alpha", float, 0.99),
    ("-cmss", "--collaberative_model_select_strategy", int, 1),
)


def declare_flags(cls: type, parser: argparse.ArgumentParser | Any, seen: set) -> None:
    """Call every ``add_args`` defined along ``cls``'s MRO, base classes first, once each."""
    for klass in reversed(cls.__mro__):
        hook = vars(klass).get("add_args")
        if hook is not None and klass not in seen:
            seen.add(klass)
            hook.__func__(klass, parser)


@functools.lru_cache(maxsize=None)
def declared_actions(*classes: type) -> tuple[argparse.Action, ...]:
    """The flags that ``classes`` (and their bases) declare, in declaration order.

    Cached (declarations are fixed once a class exists): every parse accepts every algorithm's
    flags, and the tests parse hundreds of times. Callers only read the actions."""
    scratch = ExactParser(add_help=False)
    seen: set = set()
    for cls in classes:
        declare_flags(cls, scratch, seen)
    return tuple(action for action in scratch._actions if action.option_strings)


@functools.lru_cache(maxsize=None)
def pfllib_algorithm_actions() -> tuple[argparse.Action, ...]:
    """:data:`PFLLIB_ALGORITHM_FLAGS` declared as an algorithm would declare them."""
    scratch = ExactParser(add_help=False)
    for short, long, kind, default in PFLLIB_ALGORITHM_FLAGS:
        add_flag(scratch, short, long, type=kind, default=default)
    return tuple(action for action in scratch._actions if action.option_strings)


def accept_other_flags(parser: argparse.ArgumentParser, others: Iterable[argparse.Action]) -> None:
    """Let ``parser`` accept every spelling in ``others`` (other algorithms' declarations) it lacks.

    A spelling whose destination the parser already has (declared by the selected algorithm, its
    policy or engine, or a generic flag) becomes another spelling of that flag: the selected
    declaration's type and default win. Any other spelling is parsed with the first declaration
    seen in ``others`` (so a bad value is still an error) and then ignored: its name goes to
    ``args.ignored_flags``. Neither kind is listed by ``-h``; the epilog names them per algorithm."""
    own = {action.dest: action for action in parser._actions if action.option_strings}
    for action in others:
        missing = [name for name in action.option_strings if name not in parser._option_string_actions]
        if not missing:
            continue
        target = own.get(action.dest)
        like = target if target is not None else action
        kwargs = dict(nargs=like.nargs, const=like.const, type=like.type, choices=like.choices,
                      metavar=like.metavar, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if target is not None:
            parser.add_argument(*missing, action=_SameAs, target=target, dest=target.dest, **kwargs)
        else:
            parser.add_argument(*missing, action=_Ignored, dest=IGNORED_DEST, **kwargs)


# ------------------------------------------------------------------ typed hyperparameters
#: the Python type of a value parsed with each ``type=`` of a declaration (``add_flag``'s bool is str2bool)
_PYTHON_TYPES: dict[Any, type] = {str2bool: bool, int: int, float: float, str: str, None: str}


def _is_list(action: argparse.Action) -> bool:
    return action.nargs in ("*", "+") or (isinstance(action.nargs, int) and action.nargs > 1)


def _field_type(action: argparse.Action) -> Any:
    kind = _PYTHON_TYPES.get(action.type, Any)
    if _is_list(action):
        return tuple
    return kind | None if action.default is None and kind is not Any else kind


def _convert_one(value: Any, action: argparse.Action) -> Any:
    kind = _PYTHON_TYPES.get(action.type)
    if kind is None or (isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))):
        return value
    if isinstance(value, str):
        return action.type(value)  # the flag's own parser: "False" is False for a boolean flag
    if kind is bool and value not in (0, 1):
        raise ValueError("expected a boolean")
    if kind is int and value != int(value):
        raise ValueError("expected a whole number")
    return kind(value)


def _convert(value: Any, action: argparse.Action) -> Any:
    """``value`` as the declared type: strings through the flag's own parser, whole floats to int,
    ints to float; choices are checked (a value set after parsing has not been)."""
    if value is None:
        return None
    flag = action.option_strings[0]
    try:
        if _is_list(action):
            converted = tuple(_convert_one(item, action) for item in value)
        else:
            converted = _convert_one(value, action)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise FLError(f"{flag}: cannot read {value!r} as {_field_type(action)}: {exc}") from exc
    items = converted if isinstance(converted, tuple) else (converted,)
    if action.choices is not None and any(item not in action.choices for item in items):
        raise FLError(f"{flag}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


@functools.lru_cache(maxsize=None)
def hyperparameter_type(*classes: type) -> type:
    """A frozen dataclass with one typed field (name = dest, default = declared default) per flag
    that ``classes`` declare; built once per combination of classes."""
    fields = []
    for action in declared_actions(*classes):
        default = tuple(action.default) if _is_list(action) and action.default is not None else action.default
        fields.append((action.dest, _field_type(action),
                       dataclasses.field(default=default, metadata={"action": action})))
    name = "".join(cls.__name__ for cls in classes) + "Hyperparameters"
    return dataclasses.make_dataclass(name, fields, frozen=True)


@functools.lru_cache(maxsize=256)
def _frozen(kind: type, values: tuple[tuple[str, Any], ...]) -> Any:
    return kind(**dict(values))


def hyperparameters(args: argparse.Namespace | Any, *classes: type) -> Any:
    """The flags that ``classes`` declare, read from ``args`` as typed, frozen attributes.

    ``Server`` builds ``self.hp`` from its class and its client class (a server reads its client's
    flags too, e.g. FedProx logs ``mu``), a ``Client`` from its own class, a selector from its own.
    A flag missing from ``args`` (not parsed for this algorithm) takes its declared default. Equal
    settings share one object, so a thousand clients hold one."""
    kind = hyperparameter_type(*classes)
    values = []
    for field in dataclasses.fields(kind):
        action = field.metadata["action"]
        values.append((field.name, _convert(getattr(args, field.name, field.default), action)))
    try:
        return _frozen(kind, tuple(values))
    except TypeError:  # an unhashable value (a declaration without a type=): not shared
        return kind(**dict(values))


def generic_parser() -> argparse.ArgumentParser:
    """The flags every run has (PFLlib's generic flags plus ours)."""
    parser = ExactParser(
        prog="main.py",
        description="FedCohort: federated-learning simulation (PFLlib-compatible command line).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = parser.add_argument_group("general (PFLlib)")
    add_flag(g, "-go", "--goal", type=str, default="test", help="experiment tag, part of the result file name")
    add_flag(g, "-dev", "--device", type=str, default="cuda", choices=["cpu", "cuda"],
             help="cuda falls back to cpu with a warning when no GPU is available")
    add_flag(g, "-did", "--device_id", type=str, default="0", help="GPU index used with -dev cuda")
    add_flag(g, "-data", "--dataset", type=str, default="MNIST", help="folder under dataset/ (or a path)")
    add_flag(g, "-ncl", "-nb", "--num_classes", type=int, default=None,
             help="number of classes; read from config.json (an explicit value must match it)")
    add_flag(g, "-m", "--model", type=str, default="CNN", help="model name (see the model registry)")
    add_flag(g, "-lbs", "--batch_size", type=int, default=10, low=1, help="local minibatch size B")
    add_flag(g, "-lr", "--local_learning_rate", type=float, default=0.005, above=0, help="client SGD learning rate η")
    add_flag(g, "-ld", "--learning_rate_decay", type=bool, default=False,
             help="decay each client's lr by -ldg after every local training call")
    add_flag(g, "-ldg", "--learning_rate_decay_gamma", type=float, default=0.99, above=0, help="lr decay factor")
    add_flag(g, "--local_momentum", type=float, default=0.0, low=0, below=1,
             help="heavy-ball momentum β of the clients' local SGD, PyTorch's convention without dampening "
                  "(v ← β·v + g; w ← w − lr·v); the buffer starts at zero in every local training, as the official "
                  "Sageflow code's new torch.optim.SGD per client and round (lr 0.01, β 0.9); 0 = plain SGD "
                  "(flcore/clients/clientbase.py)")
    add_flag(g, "--weight_decay", type=float, default=0.0, low=0, help="L2 weight decay λ of the clients' local SGD, as torch.optim.SGD's (g ← g + λ·w before momentum); 0 = none (flcore/clients/localstep.py)")
    add_flag(g, "-gr", "--global_rounds", type=int, default=2000, low=1, help="communication rounds")
    add_flag(g, "-tc", "--top_cnt", type=int, default=100, low=1, help="auto-break patience in evaluations")
    add_flag(g, "-ls", "--local_epochs", type=int, default=1, low=1, help="local epochs E per round")
    add_flag(g, "-algo", "--algorithm", type=str, default="FedAvg", help="algorithm name (see the list below)")
    add_flag(g, "-jr", "--join_ratio", type=float, default=1.0, above=0, high=1, help="fraction of clients selected per round")
    add_flag(g, "-rjr", "--random_join_ratio", type=bool, default=False,
             help="draw the cohort size uniformly from [nc*jr, nc] every round")
    add_flag(g, "-nc", "--num_clients", type=int, default=None,
             help="number of clients; read from config.json (an explicit value must match it)")
    add_flag(g, "-pv", "--prev", type=int, default=0, low=0, help="index of the first repeated run")
    add_flag(g, "-t", "--times", type=int, default=1, low=1, help="number of repeated runs (seeds seed+run)")
    add_flag(g, "-eg", "--eval_gap", type=int, default=1, low=1, help="evaluate every eg rounds")
    add_flag(g, "-sfn", "--save_folder_name", type=str, default="items", help="accepted for PFLlib compatibility and ignored; the final global model goes "
                  "next to the results, as <results_dir>/<data>_<algo>_<goal>_<run>.safetensors (--save_model)")
    add_flag(g, "-ab", "--auto_break", type=bool, default=False, help="stop when the best accuracy is -tc evaluations old")
    add_flag(g, "-fd", "--feature_dim", type=int, default=512, low=1, help="feature/embedding dimension of text models")
    add_flag(g, "-vs", "--vocab_size", type=int, default=None, low=1,
             help=f"vocabulary size of text models; default: the dataset's config.json vocab_size, "
                  f"else {PFLLIB_VOCAB_SIZE} (PFLlib's)")
    add_flag(g, "--bow_denominator", type=str, default=None, choices=("all", "vocabulary"),
             help="-m BoWLR's bag of words divides the word counts by every word of the sample, out-of-vocabulary "
                  "ones included (all: the default, the tag-prediction code of Reddi et al. 2021), or by the "
                  "in-vocabulary words only (vocabulary: TFF's current baseline)")
    add_flag(g, "-ml", "--max_len", type=int, default=200, low=1, help="text length")
    add_flag(g, "-fs", "--few_shot", type=int, default=0, low=0, help="if > 0 keep at most fs training samples per label per client")
    add_flag(g, "--public_data", type=str, default=None, help="a public dataset the server holds (KT-pFL): a fraction "
             "of the training pool, removed from the clients (e.g. 0.02), or a generated dataset folder (fldata/public.py)")
    add_flag(g, "--public_data_withhold", type=bool, default=False,
             help="draw --public_data's rows from the clients even where nothing in the run uses them, so that every "
                  "row of a comparison trains on the same data (without it such a run is refused)")

    o = parser.add_argument_group("platform")
    add_flag(o, "--config", type=str, default=None, metavar="FILE.toml",
             help="read flags from the [flags] table of a TOML file; flags on the command line override it "
                  "(cli/config_file.py)")
    add_flag(o, "--seed", type=int, default=0, low=0, high=SEED_HIGH, help="seed of the run; run i of -t uses seed + i")
    add_flag(o, "--engine", type=str, default="auto",
             help="training engine: auto (batched on a GPU, threaded on a multi-core CPU, else sequential), "
                  "sequential, threaded, batched")
    add_flag(o, "--select", type=str, default="uniform", help="client selection policy")
    add_flag(o, "--state_device", type=str, default="auto",
             help="where per-client state lives: auto (the compute device; on a GPU, new vectors go to the "
                  "CPU once it would keep less than 25%% of its memory), cpu, cuda, or disk (anonymous files "
                  "under --state_dir: memory stops growing with the number of clients)")
    add_flag(o, "--state_dir", type=str, default=None,
             help="directory of the --state_device disk files (default: the system's temporary directory)")
    add_flag(o, "--state_dtype", type=str, default="float32", choices=["float32", "float16", "bfloat16"],
             help="storage dtype of per-client state vectors (control variates, personal models); float16 "
                  "halves their memory, rounding what persists between participations to 11 significant bits")
    add_flag(o, "--num_threads", type=int, default=0, low=0,
             help="torch CPU threads (0 = torch's default); also bounds the threaded engine's workers unless "
                  "--workers is given; 1 is often fastest for small models on a busy machine")
    add_flag(o, "--malloc_keep_freed", type=str, default="on", choices=["on", "off"],
             help="on: freed memory stays in the process (glibc's mmap and trim thresholds raised to 1 GiB), so "
                  "large temporaries reuse it without page faults (APPLE -dlr 0.01: -15%% CPU a round); peak RSS "
                  "measured +0.2%% (P1 FedAvg) and +0.4%% (P3); off: glibc's defaults, large freed blocks go back "
                  "to the system; no effect on other C libraries (utils/allocator.py)")
    add_flag(o, "--compact_inputs", type=bool, default=True,
             help="hold inputs with at most 256 distinct values (8-bit images) as uint8 codes plus a table of "
                  "their float values: a quarter of the memory, decoded per batch to the same floats")
    add_flag(o, "--eval_batch_size", type=int, default=0, low=0,
             help="batch size of evaluation passes: 0 = auto (128 on a CPU, fastest measured for the CNNs with "
                  "channels-last; 2048 on a GPU, where a batch of 128 leaves the device waiting on kernel launches); "
                  "metrics differ only by float rounding")
    add_flag(o, "--eval_frozen", type=bool, default=False,
             help="CPU evaluation passes of 512+ rows run a frozen TorchScript copy of the model (oneDNN's "
                  "prepacked, fused convolutions: a P1 evaluation 1.2x cheaper; logits equal up to float rounding). "
                  "Each copy's graphs are freed after its pass (PyTorch would keep them: pytorch#35600, #96726); off "
                  "by default until proven on long runs")
    add_flag(o, "--eval_group", type=int, default=0,
             help="personal models evaluated at once under torch.func.vmap (personalised algorithms): 0 = auto "
                  "(one by one on a CPU, where that is fastest; on a GPU as many as fit a quarter of its free "
                  "memory), 1 = one by one, N = N at a time; results differ only by float rounding")
    add_flag(o, "--conv_layout", type=str, default="auto", choices=["auto", "nchw", "channels_last"],
             help="memory layout of 2-d convolutions: auto (channels_last on the CPU, where oneDNN is 1.3-3x "
                  "faster with it, nchw on GPUs); results differ only by float rounding")
    add_flag(o, "--cudnn_benchmark", type=bool, default=False,
             help="GPU: let cuDNN time its algorithms for each convolution shape on first use and keep the fastest "
                  "(torch.backends.cudnn.benchmark; the batched engine's vmapped convolutions are grouped ones, "
                  "where cuDNN's default choice may be slow); off by default because the timed choice, and so the "
                  "last bits of the results, may differ between runs; no effect on a CPU")
    add_flag(o, "--precision", type=str, default="fp32", choices=["fp32", "tf32", "bf16"],
             help="arithmetic of local training: fp32, tf32 (TF32 tensor cores, GPU) or bf16 (autocast); weights, "
                  "state and aggregation stay fp32 (flcore/engines/precision.py); not with -dp")
    add_flag(o, "--eval_auc", type=bool, default=True, help="compute the micro-AUC at every evaluation")
    add_flag(o, "--eval_train_loss", type=bool, default=True, help="evaluate the train loss over all clients' train data")
    add_flag(o, "--eval_clients", type=int, default=None, low=0, help="evaluate a sample of K clients each evaluation, drawn from (seed, round) and saved as rs_eval_clients (0: every client, PFLlib's); default: every client up to 10,000 clients, a sample of 1,000 above (flcore/evaluation.py)")
    add_flag(o, "--drop_last", type=bool, default=True, help="skip a trailing partial local batch (PFLlib)")
    add_flag(o, "--avg_last", type=int, default=10, low=1, help="report the mean accuracy of the last N evaluations")
    add_flag(o, "--target_acc", type=float, default=None, low=0, high=1, help="report the round and traffic to reach this accuracy")
    add_flag(o, "--results_dir", type=str, default=None, help="where h5 results go (default <repo>/results)")
    add_flag(o, "--data_root", type=str, default=None, help="folder holding datasets (default <repo>/dataset)")
    add_flag(o, "--legacy_pickle", type=bool, default=False,
             help="allow PFLlib's pickled npz files (unsafe: unpickling can run code from the file)")
    add_flag(o, "--save_model", type=bool, default=True,
             help="save the final global model next to the results as <result>.safetensors (personalised "
                  "algorithms also <result>.personal.safetensors, one state_dict per client under 'client<i>/')")
    add_flag(o, "--checkpoint_every", type=int, default=0, low=0,
             help="write a checkpoint (<result>.ckpt) every N rounds, for --resume; 0 = only when interrupted")
    add_flag(o, "--resume", type=bool, default=False,
             help="continue each run from its checkpoint (same flags required), skip finished runs, start the others")
    add_flag(o, "--overwrite", type=bool, default=False,
             help="replace existing results of the same name (-data, -algo, -go, run); without it they are kept and the run refused")
    add_flag(o, "--progress", type=bool, default=True, help="show a progress bar over rounds")
    add_flag(o, "-q", "--quiet", type=bool, default=False, help="only print the summary")
    add_flag(o, "--tensorboard", type=tensorboard_dir, default=None, metavar="DIR",
             help="write TensorBoard scalars per round under DIR (needs the tensorboard package)")
    return parser
