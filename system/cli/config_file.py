"""main.py's flags from a TOML file: ``main.py --config FILE.toml`` and the suites' flag tables.

A run's file holds one table, ``[flags]``, of main.py flags named without their dashes, in any
spelling main.py accepts (``lr``, ``local_learning_rate``, ``algo``, ``local-momentum``)::

    [flags]
    data = "MNIST"
    m = "SimpleCNN"
    algo = "FedNova"
    lr = 0.01
    local_momentum = 0.9
    eval_auc = false

A value becomes the flag's text (``true``/``false`` as ``True``/``False``; a list as the flag's
several values). The file's flags go *before* the command line's, so a flag given on the command
line overrides the file's (argparse keeps the last value). The resolved flags of every run are
stored in its h5 file (``config``), so a run made from a file is as reproducible as one typed out.
A suite (``system/suite.py``) has the same ``[flags]`` table, and more tables around it.
"""
from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

from utils.errors import FLError

#: main.py's flag naming the file
CONFIG_FLAG = "--config"


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; one line naming the file and the problem otherwise."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FLError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FLError(f"{path}: a folder, not a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise FLError(f"{path}: not valid TOML: {exc}") from None


def find_flag(parser: argparse.ArgumentParser, key: str) -> argparse.Action | None:
    """The action of ``key`` (a flag without dashes: ``lr``, ``local_learning_rate``), or None."""
    for spelling in (f"--{key}", f"-{key}"):
        action = parser._option_string_actions.get(spelling)
        if action is not None:
            return action
    return None


def flag_tokens(table: Mapping[str, Any], parser: argparse.ArgumentParser, where: str) -> list[str]:
    """main.py's command-line tokens for a table of flags; ``where`` names the table in errors."""
    tokens: list[str] = []
    for key, value in table.items():
        action = find_flag(parser, key) if not key.startswith("-") else None
        if action is None or action.dest == "help":
            raise FLError(f"{where}: {key!r} is not a flag of main.py; write flags without their dashes, "
                          f"as main.py spells them (lr, local_learning_rate; see python main.py -h)")
        flag = next(s for s in action.option_strings if s.lstrip("-") == key)
        tokens += _tokens_of(flag, action, value, where)
    return tokens


def _tokens_of(flag: str, action: argparse.Action, value: Any, where: str) -> list[str]:
    if isinstance(value, dict):
        raise FLError(f"{where}: {flag.lstrip('-')} is a table; a flag takes a value or a list of values")
    if action.nargs == 0:  # a bare switch (store_true)
        if not isinstance(value, bool):
            raise FLError(f"{where}: {flag.lstrip('-')} is a switch; write true or false, got {value!r}")
        return [flag] if value else []
    values = value if isinstance(value, list) else [value]
    if not values:
        raise FLError(f"{where}: {flag.lstrip('-')} = [] gives the flag no value")
    return [flag, *(_text(v) for v in values)]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def config_path(argv: list[str]) -> tuple[str | None, list[str]]:
    """The ``--config FILE`` (or ``--config=FILE``) of ``argv`` and the other tokens."""
    rest: list[str] = []
    found: str | None = None
    tokens = iter(argv)
    for token in tokens:
        key, sep, value = token.partition("=")
        if key != CONFIG_FLAG:
            rest.append(token)
            continue
        if found is not None:
            raise FLError(f"{CONFIG_FLAG} is given twice; give one file")
        found = value if sep else next(tokens, None)
        if not found:
            raise FLError(f"{CONFIG_FLAG} needs a TOML file: {CONFIG_FLAG} FILE.toml")
    return found, rest


def run_table(path: str | Path) -> dict[str, Any]:
    """The ``[flags]`` table of a run's file (a file with other tables is refused: a suite has its own runner)."""
    data = read_toml(path)
    if "suite" in data:
        raise FLError(f"{path} is a suite; run it with python system/suite.py run {path}")
    other = sorted(set(data) - {"flags"})
    if other:
        raise FLError(f"{path}: unknown key(s) {', '.join(other)}; a run's file holds one table, [flags]")
    if "flags" not in data:
        raise FLError(f"{path}: no [flags] table; put main.py's flags under [flags]")
    if not isinstance(data["flags"], dict):
        raise FLError(f"{path}: flags must be a table ([flags])")
    return data["flags"]


def expand_config(argv: list[str], build_parser: Callable[[list[str]], argparse.ArgumentParser]) -> list[str]:
    """``argv`` with ``--config FILE`` replaced by the file's flags, placed before the command line's
    so that these override the file's; ``argv`` unchanged without ``--config``. ``build_parser`` is
    main.py's (every algorithm's flags are spelled in it, so any parser finds the spellings)."""
    path, rest = config_path(argv)
    if path is None:
        return argv
    table = run_table(path)
    return flag_tokens(table, build_parser(rest), str(path)) + rest
