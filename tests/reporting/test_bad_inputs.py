"""The reporting tools' bad inputs, as a hostile new user tried them: each asserts the one line the
tool prints, its exit status, and that no file on disk changed."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import plot
import report
import summarize
from resultfiles import write_ours, write_pfllib
from reporting.settings import RUN_ONLY_KEYS
from utils.errors import FLError
from reporting.results import write_atomically


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def config(**flags) -> str:
    base = {"dataset": "/data/Digits", "algorithm": "FedAvg", "goal": "mix", "model": "MLR",
            "local_learning_rate": 0.005, "seed": 0, "times": 1, "prev": 0, "device": "cpu"}
    return json.dumps({**base, **flags})


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """``-go mix`` with ``-m MLR``, then ``-m DNN -lr 0.1 -pv 1 -t 2``; and two
    repeats of one setting (seeds 0 and 1 of ``-t 2``), which belong together."""
    folder = tmp_path / "results"
    folder.mkdir()
    write_ours(folder, "Digits", "FedAvg", "mix", 0, [0.1, 0.4, 0.5], attrs={"config": config()})
    write_ours(folder, "Digits", "FedAvg", "mix", 1, [0.1, 0.7, 0.9], attrs={"config": config(
        model="DNN", local_learning_rate=0.1, seed=1, times=2, prev=1, device="cuda")})
    for run in range(2):
        write_ours(folder, "Digits", "FedProx", "mix", run, [0.1, 0.5, 0.6],
                   attrs={"config": config(algorithm="FedProx", seed=run, times=2)})
    return folder


# ------------------------------------------------------- 3: runs of different settings are not averaged

def test_summarize_splits_runs_made_with_different_settings(mixed: Path, capsys) -> None:
    before = snapshot(mixed)
    assert summarize.main(["--results_dir", str(mixed), "--csv", "", "--md", ""]) == 0
    out, err = capsys.readouterr()
    warning = lines_with(err, "different settings")
    assert len(warning) == 1 and "local_learning_rate, model differ" in warning[0], err
    assert "device" not in warning[0] and "seed" not in warning[0]  # how it ran, and the repeat's seed
    rows = [line.split("  ")[0] for line in out.splitlines() if line.startswith("Fed")]
    assert rows == ["FedAvg {local_learning_rate=0.005, model=MLR}",
                    "FedAvg {local_learning_rate=0.1, model=DNN}", "FedProx"]
    assert all(line.split()[-1] != "2" for line in out.splitlines() if line.startswith("FedAvg"))
    assert snapshot(mixed) == before


def test_plot_and_report_split_them_too(mixed: Path, tmp_path: Path, capsys) -> None:
    before = snapshot(mixed)
    assert plot.main(["-data", "Digits", "-algo", "FedAvg", "FedProx", "-go", "mix", "--results_dir",
                      str(mixed), "--out", str(tmp_path / "png")]) == 0
    out, err = capsys.readouterr()
    assert len(lines_with(err, "different settings")) == 1
    assert "FedAvg {local_learning_rate=0.1, model=DNN}" in out and "FedProx" in out
    page = tmp_path / "page.html"
    assert report.main(["--results_dir", str(mixed), "--out", str(page)]) == 0
    assert len(lines_with(capsys.readouterr().err, "different settings")) == 1
    assert page.read_text().count("<td>FedAvg {local_learning_rate=") == 2
    assert snapshot(mixed) == before


def test_run_only_flags_are_sweeps() -> None:
    import sweep  # imports main.py, hence torch: only this check needs it

    assert RUN_ONLY_KEYS == sweep.RUN_ONLY_DESTS | {"ignored_flags"}, (
        "sweep.py and reporting/settings.py must agree on which flags do not change a result")


# ------------------------------------------------------------- 4: nothing is left out without a word

def test_every_file_left_out_is_listed(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    write_ours(folder, "Digits", "FedAvg", "test", 0, [0.1, 0.5])
    write_ours(folder, "..", "FedAvg", "test", 0, [0.1, 0.5])  # -data .. : hidden, but a result
    # The names -go '' and -data '.' make: not <data>_<algo>_<goal>_<run>.h5.
    write_pfllib(folder, "dg4", "FedAvg", "", 0, [0.1, 0.2])
    write_pfllib(folder, "", "FedAvg", "dot", 0, [0.1, 0.2])
    (folder / "Digits_FedAvg_test_1.h5").mkdir()
    (folder / "Digits_FedAvg_test_2.h5").write_bytes(b"not hdf5")
    before = snapshot(folder)
    misnamed = "dg4_FedAvg__0.h5"
    for main, argv in ((summarize.main, ["--csv", "", "--md", ""]), (report.main, ["--out", str(tmp_path / "r.html")])):
        assert main(["--results_dir", str(folder), *argv]) == 0
        out, err = capsys.readouterr()
        listed = lines_with(err, "left out 2 file(s)")
        assert len(listed) == 1 and misnamed in listed[0] and "_FedAvg_dot_0.h5" in listed[0]
        assert len(lines_with(err, "Digits_FedAvg_test_1.h5: not a file; left out")) == 1
        assert len(lines_with(err, "Digits_FedAvg_test_2.h5: not a readable HDF5 result file")) == 1
        assert ".. (goal: test)" in out or "<h2>..</h2>" in (tmp_path / "r.html").read_text()
    # plot.py: a folder with a run's name, a file whose attributes name another algorithm.
    (folder / "Digits_FedAvg_test_2.h5").unlink()
    write_ours(folder, "Digits", "FedProx", "test", 0, [0.1, 0.5], attrs={"algorithm": "FedAvg"})
    before = snapshot(folder)
    assert plot.main(["-data", "Digits", "-algo", "FedAvg", "--results_dir", str(folder), "--out", str(tmp_path)]) == 0
    assert len(lines_with(capsys.readouterr().err, "Digits_FedAvg_test_1.h5: not a file; left out of FedAvg")) == 1
    assert plot.main(["-data", "Digits", "-algo", "FedProx", "--results_dir", str(folder)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(lines_with("\n".join(err), "attributes say algorithm='FedAvg'; file left out of FedProx")) == 1
    assert len(err) == 2 and err[-1].startswith("plot.py: error: no results for algorithm FedProx")
    assert snapshot(folder) == before


# ---------------------------------------------------- 15: a dataset path, both spellings of the flag

def test_a_dataset_path_means_its_name_as_in_main(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    for run in range(2):
        write_ours(folder, "Digits", "FedAvg", "tt", run, [0.1, 0.5, 0.6])
    before = snapshot(folder)
    data = str(tmp_path / "data" / "Digits")
    assert plot.main(["-data", data, "-go", "tt", "-algo", "FedAvg", "--results_dir", str(folder),
                      "--out", str(tmp_path / "png")]) == 0
    assert (tmp_path / "png" / "Digits_tt_acc.png").is_file()
    assert "Digits (goal: tt)" in capsys.readouterr().out
    assert summarize.main(["-data", data + "/", "--results-dir", str(folder), "--csv", "", "--md", ""]) == 0
    assert "FedAvg" in capsys.readouterr().out
    # Nothing there: the pattern searched is the dataset's name, not the path.
    assert plot.main(["-data", data, "-go", "other", "-algo", "FedAvg", "--results-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder}/Digits_FedAvg_other_<run>.h5" in err
    assert snapshot(folder) == before


@pytest.mark.parametrize("tool", [plot, summarize, report])
@pytest.mark.parametrize("spelling", ["--results_dir", "--results-dir"])
def test_every_tool_takes_both_spellings(tool, spelling: str, tmp_path: Path, capsys) -> None:
    write_ours(tmp_path, "Digits", "FedAvg", "test", 0, [0.1, 0.5])
    argv = ["-data", "Digits", "-algo", "FedAvg"] if tool is plot else []
    assert tool.main([*argv, spelling, str(tmp_path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("data", [".", "..", ""])
def test_a_dataset_that_names_no_folder_is_refused(data: str, tmp_path: Path, capsys) -> None:
    write_ours(tmp_path, "Digits", "FedAvg", "test", 0, [0.1, 0.5])
    before = snapshot(tmp_path)
    assert plot.main(["-data", data, "-algo", "FedAvg", "--results_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names no dataset" in err
    assert snapshot(tmp_path) == before


# --------------------------------------------------- 16: read-only says read-only; --out names --out

def read_only(monkeypatch, code: int = errno.EROFS) -> None:
    """The results folder refuses new files, as a read-only mount does (chmod does not stop root)."""
    def refuse(*_args, **_kwargs):
        raise OSError(code, "refused")
    monkeypatch.setattr("reporting.results.tempfile.mkstemp", refuse)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_read_only_results_folder_says_read_only(code: int, tmp_path: Path, monkeypatch, capsys) -> None:
    write_ours(tmp_path, "Digits", "FedAvg", "test", 0, [0.1, 0.5])
    before = snapshot(tmp_path)
    read_only(monkeypatch, code)
    assert summarize.main(["--results_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(lines_with("\n".join(err), "error")) == 1 and "it is read-only: pass another --csv" in err[-1]
    assert "free some space" not in err[-1]
    assert plot.main(["-data", "Digits", "-algo", "FedAvg", "--results_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "read-only: pass another --out" in err[0]
    # main.py writes its results through the same function: it names --results_dir.
    with pytest.raises(FLError, match="it is read-only: pass another --results_dir$"):
        write_atomically(tmp_path / "x.h5", lambda tmp: None)
    assert snapshot(tmp_path) == before


def test_a_full_disk_still_says_free_some_space(tmp_path: Path, monkeypatch) -> None:
    read_only(monkeypatch, errno.ENOSPC)
    with pytest.raises(FLError, match=r"\(No space left on device\); free some space or pass another --results_dir"):
        write_atomically(tmp_path / "x.h5", lambda tmp: None)


def test_report_out_a_folder_names_out(tmp_path: Path, capsys) -> None:
    results = tmp_path / "results"
    results.mkdir()
    write_ours(results, "Digits", "FedAvg", "test", 0, [0.1, 0.5])
    (tmp_path / "pages").mkdir()
    before = snapshot(tmp_path)
    assert report.main(["--results_dir", str(results), "--out", str(tmp_path / "pages")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "it is a folder; pass --out with a file name" in err
    assert "--results_dir" not in err
    assert snapshot(tmp_path) == before
