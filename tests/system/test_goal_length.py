"""A ``-go`` too long for the file names a run builds from it is refused with the other ``-go``
rules (one line naming the longest goal that fits, exit 2, nothing written), not as a results
folder that "cannot be written"; the longest goal it names runs, personalised models included."""
from __future__ import annotations

import os

import pytest

import main
from toydata import make_dataset


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), num_clients=2, input_shape=(4,))


def run(capsys, toy, results, goal, *extra):
    code = main.main(["-data", str(toy), "-m", "MLR", "-gr", "1", "-lbs", "4", "-dev", "cpu", "--progress", "False",
                      "-q", "True", "--results_dir", str(results), "-go", goal, *extra])
    out, err = capsys.readouterr()
    return code, err


def longest_goal(capsys, toy, results, *extra):
    """The goal length the refusal of a 301-character goal names, after checking the refusal."""
    code, err = run(capsys, toy, results, "g" * 301, *extra)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: -go is 301 characters, too long for the file names of a run"), err
    assert not results.exists() or list(results.iterdir()) == []
    return int(err.rsplit("pass a -go of at most ", 1)[1])


@pytest.mark.parametrize("algo", ["FedAvg", "Ditto"])  # Ditto also writes <run>.personal.safetensors
def test_a_goal_too_long_for_file_names_is_one_line(capsys, toy, tmp_path, algo):
    results = tmp_path / "res"
    room = longest_goal(capsys, toy, results, "-algo", algo, "-t", "2")
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    # "..Toy_<algo>_<goal>_1.personal.safetensors.new.XXXXXXXX.tmp", run 1 of -t 2
    assert room == limit - len(f"..Toy_{algo}__1.personal.safetensors.new.XXXXXXXX.tmp")
    code, err = run(capsys, toy, results, "g" * (room + 1), "-algo", algo, "-t", "2")
    assert code == 2 and f"pass a -go of at most {room}" in err
    code, err = run(capsys, toy, results, "g" * room, "-algo", algo, "-t", "2")
    assert code == 0, err
    names = sorted(p.name for p in results.iterdir())
    assert f"Toy_{algo}_{'g' * room}_1.h5" in names and not [n for n in names if n.endswith((".tmp", ".new"))]


def test_a_dataset_name_leaving_no_room_for_a_goal_is_refused(capsys, tmp_path):
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "D" * (limit - 30)  # a valid folder name, but with the result suffixes over the limit
    data = make_dataset(tmp_path, name=name, num_clients=2, input_shape=(4,))
    code, err = run(capsys, data, tmp_path / "res", "g")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: -data '{data}': the folder's name is too long to name result files"), err
    assert not (tmp_path / "res").exists()
