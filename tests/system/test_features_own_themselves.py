"""Each cross-cutting feature owns itself: its flags, checks, warnings and summary lines live in its
plug-in (flcore/extension.py's contract), and the entry point, the flag catalogue, the base classes,
the engines and the algorithms never name one."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import main
from conftest import REPO
from flcore.features import features
from cli.flags import generic_parser

SYSTEM = REPO / "system"
#: flags that belong to features (the grep of the contract: none of these is read where features are not)
FEATURE_FLAGS = re.compile(r"(args\.|getattr\([\w.]*args, [\"'])(privacy|dp_|attack|robust|straggler|client_trace|dlg|"
                           r"num_new_clients|client_drop_rate|train_slow_rate|send_slow_rate)")


def feature_free_files() -> list[Path]:
    return [SYSTEM / "main.py", *sorted((SYSTEM / "flcore" / "servers").glob("*.py")),
            SYSTEM / "flcore" / "clients" / "clientbase.py", *sorted((SYSTEM / "flcore" / "engines").rglob("*.py")),
            *sorted((SYSTEM / "runner").glob("*.py"))]


def test_no_feature_flag_is_read_outside_its_feature():
    hits = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in feature_free_files()
            for n, line in enumerate(path.read_text().splitlines(), 1) if FEATURE_FLAGS.search(line)]
    assert not hits, "\n".join(hits)


def feature_modules() -> set[str]:
    return {cls.__module__ for cls in features()} | {"flcore.features", "flcore.features.privacy"}


def test_no_algorithm_imports_a_feature_module():
    modules = feature_modules()
    offenders = []
    for path in sorted((SYSTEM / "flcore" / "servers").glob("*.py")) + sorted((SYSTEM / "flcore" / "clients").glob("*.py")):
        if path.name in ("serverbase.py", "__init__.py"):
            continue  # the base server builds the plug-ins through the registry
        for match in re.finditer(r"^\s*(?:from|import) ([\w.]+)", path.read_text(), re.M):
            name = match.group(1)
            if any(name == m or name.startswith(m + ".") for m in modules):
                offenders.append(f"{path.relative_to(REPO)}: {match.group(0).strip()}")
    assert not offenders, offenders


def test_the_flag_catalogue_holds_no_feature_flag():
    generic = {action.dest for action in generic_parser()._actions}
    probe = main.build_parser([])
    for feature in features():
        own = {a.dest for a in probe._actions if a.container.title == (feature.flag_group or feature.registered_name)}
        assert own, f"{feature.registered_name} declares no flag under its own heading"
        assert not own & generic, (feature.registered_name, own & generic)


def test_main_stays_an_entry_point():
    assert len((SYSTEM / "main.py").read_text().splitlines()) <= 350


@pytest.mark.parametrize("argv, message", [
    (["-dps", "1"], "needs -dp"),
    (["-ften", "2"], "give -nnc N"),
    (["--client_trace", "/nonexistent/trace.csv"], "no such file"),
    (["-algo", "FedMA", "-dlg"], "FedMA's global model changes widths"),
])
def test_features_refuse_their_own_flags_before_any_data(argv, message, capsys):
    assert main.main(["-data", "/nonexistent", "-dev", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0, err
