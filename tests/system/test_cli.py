"""The command line: exact flag matching, PFLlib's flags with any -algo, -nb, one destination per
flag, and the typed, frozen hyperparameters (``hp``) algorithms read."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

import main
from fltest import REQUIRED_FLAGS, build_server, make_args, random_dataset
from flcore.registry import ALGORITHMS, ENGINES, SELECTORS, load_all
from toydata import make_dataset
from cli.flags import IGNORED_DEST, PFLLIB_ALGORITHM_FLAGS, declared_actions, generic_parser, hyperparameters, str2bool
from utils.errors import FLError

load_all()
ALGORITHM_NAMES = ALGORITHMS.names()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), num_clients=3, input_shape=(1, 8, 8), num_classes=10)


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main.main(["-dev", "cpu", "--progress", "False", "-m", "DNN", "-gr", "1", "--save_model", "False",
                          *argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def every_declaration() -> list[argparse.Action]:
    """Each flag declared by a registered algorithm, selection policy or engine, and PFLlib's list."""
    actions: list[argparse.Action] = []
    for name in ALGORITHM_NAMES:
        server_cls = ALGORITHMS.get(name)
        actions += declared_actions(server_cls, server_cls.client_cls)
    for registry in (SELECTORS, ENGINES):
        for name in registry.names():
            actions += declared_actions(registry.get(name))
    return actions + list(main.pfllib_algorithm_actions())


def sample_value(action: argparse.Action) -> str:
    """A value the declaration accepts (its default, or its first choice)."""
    if action.choices:
        return str(list(action.choices)[0])
    if action.type is str2bool:
        return "True"
    if action.default is None:
        return {int: "1", float: "0.5"}.get(action.type, "x")
    return str(action.default)


# ---------------------------------------------------------------- PFLlib's flags with any algorithm
@pytest.mark.parametrize("argv,ignored", [
    (["-algo", "FedAvg", "-mu", "0.1"], ["-mu"]),   # was "-m u" plus a stray 0.1
    (["-al", "0.5"], ["-al"]),                      # was "-algo 0.5"
    (["-tau", "1.0"], ["-tau"]),                    # was "-t au"
    (["-algo", "FedAvg", "-lf", "-M", "3", "-itk", "10", "-ca", "0.5"], ["-lf", "-M", "-itk", "-ca"]),  # PFLlib only
    (["-algo", "SCAFFOLD", "--igfl_sim", "cos", "--adafl_beta", "0.2"], ["--igfl_sim", "--adafl_beta"]),
])
def test_flags_of_other_algorithms_are_accepted_and_ignored(argv, ignored):
    args = main.parse_args(argv)
    assert getattr(args, IGNORED_DEST) == ignored
    assert args.times == 1 and args.model == "CNN"  # nothing was read as a generic flag
    assert not any(hasattr(args, dest) for dest in ("mu", "alpha", "tau", "M", "igfl_sim", "adafl_beta"))


def test_a_flag_the_algorithm_declares_is_not_ignored():
    args = main.parse_args(["-algo", "FedProx", "-mu", "0.1", "-tau", "2"])
    assert args.mu == 0.1 and getattr(args, IGNORED_DEST) == ["-tau"]
    assert getattr(main.parse_args(["-algo", "FedProx"]), IGNORED_DEST) == []


def test_ignored_values_are_still_checked():
    with pytest.raises(SystemExit) as exit_info:
        main.parse_args(["-algo", "FedAvg", "-mu", "abc"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_every_declared_flag_is_accepted_with_any_algorithm(algorithm):
    server_cls = ALGORITHMS.get(algorithm)
    own = {name: action for action in declared_actions(server_cls, server_cls.client_cls) for name in action.option_strings}
    argv = ["-algo", algorithm, *REQUIRED_FLAGS.get(algorithm, [])]
    flags = []
    for action in every_declaration():
        for name in action.option_strings:
            if name not in flags:
                flags.append(name)
                argv += [name, sample_value(own.get(name, action))]
    args = main.parse_args(argv)
    assert args.algorithm == server_cls.registered_name
    ignored = set(getattr(args, IGNORED_DEST))
    assert ignored and not ignored & set(own)  # the algorithm's own flags are read, the others ignored
    hp = hyperparameters(args, server_cls, server_cls.client_cls)
    assert {f.name for f in dataclasses.fields(hp)} == {a.dest for a in own.values()}


def test_pfllib_flags_are_all_known():
    parser = main.build_parser(["-algo", "FedAvg"])
    for short, long, _, _ in PFLLIB_ALGORITHM_FLAGS:
        assert short in parser._option_string_actions and long in parser._option_string_actions


# ---------------------------------------------------------------- exact matching
@pytest.mark.parametrize("argv", [
    ["--glob", "3"],            # a prefix of --global_rounds
    ["--global", "3"],
    ["-alg", "FedProx"],        # a prefix of -algo
    ["-mMLR"],                  # a short flag glued to its value: -m MLR
    ["-t2"],
    ["-lr0.1"],
    ["-algoFedProx"],
])
def test_no_prefix_matching_or_splitting(argv):
    with pytest.raises(SystemExit) as exit_info:
        main.parse_args(argv)
    assert exit_info.value.code == 2


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.parse_args(["--glob", "3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and "--glob" in err


def test_flag_equals_value_forms_stay():
    args = main.parse_args(["--global_rounds=7", "--algorithm=FedProx", "--mu=0.3", "-lr=0.1"])
    assert (args.global_rounds, args.algorithm, args.mu, args.local_learning_rate) == (7, "FedProx", 0.3, 0.1)


# ---------------------------------------------------------------- -nb
def test_nb_is_num_classes():
    assert main.parse_args(["-nb", "10"]).num_classes == 10
    assert main.parse_args(["-nb", "10"]).num_classes == main.parse_args(["-ncl", "10"]).num_classes


def test_nb_is_checked_against_config_json(toy, tmp_path, capsys):
    code, _, err = run_main(capsys, "-data", str(toy), "-nb", "3", "--results_dir", str(tmp_path / "bad"))
    assert code == 2 and "does not match" in err and len(err.strip().splitlines()) == 1
    code, _, _ = run_main(capsys, "-data", str(toy), "-nb", "10", "--results_dir", str(tmp_path / "good"))
    assert code == 0


# ---------------------------------------------------------------- one destination, selected declaration wins
def test_one_destination_per_flag():
    dests: dict[str, set[str]] = {}
    for action in every_declaration():
        for name in action.option_strings:
            dests.setdefault(name, set()).add(action.dest)
    assert {name: d for name, d in dests.items() if len(d) > 1} == {}
    assert dests["-slr"] == {"server_learning_rate"}


@pytest.mark.parametrize("algorithm,default", [("FedAvgM", 1.0), ("SCAFFOLD", 1.0), ("FedAdam", 0.01),
                                               ("FedYogi", 0.01), ("FedAdagrad", 0.01)])
def test_slr_has_one_destination_with_each_algorithms_default(algorithm, default):
    data = random_dataset(num_clients=2, dim=3)
    assert build_server(make_args(algorithm), data).hp.server_learning_rate == default
    for spelling in ("-slr", "--server_learning_rate", "--server-learning-rate", "--server_lr"):
        args = main.parse_args(["-algo", algorithm, spelling, "0.3"])
        assert args.server_learning_rate == 0.3 and getattr(args, IGNORED_DEST) == []
        assert build_server(args, data).hp.server_learning_rate == 0.3
    assert not hasattr(main.parse_args(["-algo", algorithm]), "server_lr")


def test_the_selected_algorithms_declaration_wins():
    # -bt is pFedMe's β (default 1) and Per-FedAvg's second step size (default 0 = -lr)
    assert main.parse_args(["-algo", "pFedMe"]).beta == 1.0
    assert main.parse_args(["-algo", "PerAvg"]).beta == 0.0
    # -lam is declared by FedAMP and pFedMe; -al by APFL with its own default (PFLlib's is 1.0)
    assert main.parse_args(["-algo", "APFL"]).alpha == 0.25


# ---------------------------------------------------------------- typed, frozen hyperparameters
def test_hyperparameters_are_typed_and_frozen():
    data = random_dataset(num_clients=3, dim=3)
    server = build_server(make_args("APFL", "-al", "1", "--apfl_adaptive_alpha", "False"), data)
    hp = server.hp
    assert hp.alpha == 1.0 and type(hp.alpha) is float
    assert hp.apfl_adaptive_alpha is False
    types = {f.name: f.type for f in dataclasses.fields(hp)}
    assert types == {"alpha": float, "apfl_adaptive_alpha": bool}
    with pytest.raises(dataclasses.FrozenInstanceError):
        hp.alpha = 0.5
    # clients with equal settings share one object; a client holds only its own class's flags
    assert server.clients[0].hp is server.clients[2].hp
    assert dataclasses.asdict(server.clients[0].hp) == {"alpha": 1.0, "apfl_adaptive_alpha": False}


def test_selector_hyperparameters_are_typed():
    server = build_server(make_args("FedAvg", "--select", "adafl", "--adafl_replace", "1", "--adafl_num_fracs", "3"),
                          random_dataset(num_clients=4, dim=3))
    hp = server.selector.hp
    assert hp.adafl_replace is True and hp.adafl_num_fracs == 3 and type(hp.adafl_num_fracs) is int
    assert server.selector.replace is True


def test_values_set_after_parsing_are_converted_and_checked():
    args = make_args("FedProx")
    args.mu = "0.25"  # e.g. from a config file
    server_cls = ALGORITHMS.get("FedProx")
    assert hyperparameters(args, server_cls, server_cls.client_cls).mu == 0.25
    args.mu = 2
    assert type(hyperparameters(args, server_cls, server_cls.client_cls).mu) is float
    args = make_args("APFL")
    args.apfl_adaptive_alpha = "no"
    assert hyperparameters(args, ALGORITHMS.get("APFL").client_cls).apfl_adaptive_alpha is False
    args = make_args("FedACS")
    args.fedacs_pool = "everyone"
    with pytest.raises(FLError, match="--fedacs_pool"):
        build_server(args, random_dataset(num_clients=2, dim=3))
    args = make_args("FedAMP")
    args.sigma = "wide"
    with pytest.raises(FLError, match="-sg"):
        build_server(args, random_dataset(num_clients=2, dim=3))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_every_algorithms_hyperparameters_have_their_declared_types(algorithm):
    server_cls = ALGORITHMS.get(algorithm)
    hp = hyperparameters(make_args(algorithm, *REQUIRED_FLAGS.get(algorithm, [])), server_cls, server_cls.client_cls)
    by_dest = {a.dest: a for a in declared_actions(server_cls, server_cls.client_cls)}
    python_type = {str2bool: bool, int: int, float: float, str: str, None: str}
    for field in dataclasses.fields(hp):
        value = getattr(hp, field.name)
        assert value == by_dest[field.name].default
        assert value is None or type(value) is python_type[by_dest[field.name].type], field.name


def test_boolean_flags_are_declared_as_booleans():
    """A flag with a True/False default is declared with ``type=bool`` (parsed by str2bool), never as a
    string read back as a boolean elsewhere."""
    actions = every_declaration() + [a for a in generic_parser()._actions if a.option_strings and a.dest != "help"]
    for action in actions:
        assert isinstance(action.default, bool) == (action.type is str2bool), action.option_strings


# ---------------------------------------------------------------- through main
def test_main_runs_with_other_algorithms_flags_and_says_which_it_ignores(toy, tmp_path, capsys):
    code, out, err = run_main(capsys, "-data", str(toy), "-algo", "FedAvg", "-mu", "0.1", "-al", "0.5", "-tau", "1.0",
                              "-slr", "2", "--results_dir", str(tmp_path), "-q", "False")
    assert code == 0, err
    lines = [line for line in out.splitlines() if "ignored" in line]
    assert lines == ["FedAvg does not use -mu, -al, -tau, -slr: ignored"]
    assert len(list(tmp_path.glob("*.h5"))) == 1
