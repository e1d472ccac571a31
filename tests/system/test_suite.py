"""system/suite.py: suite files are validated (one line, exit 2); a tiny suite runs, is interrupted
and resumed without rerunning finished runs, renders a page whose numbers are the h5 files', is
sharded; the CI check fails on a changed curve."""
from __future__ import annotations

import json
import os
import re
import subprocess
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

import main
import suite
import sweep
from reporting.results import read_results

SUITES = sorted((suite.ROOT / "suites").glob("*.toml"))

TINY = """
[suite]
title = "tiny"
about = "two algorithms, two rounds"
source = "a test"
seeds = 1
metric = "best"
target = 0.2

[flags]
m = "DNN"
gr = 2
lbs = 10
lr = 0.05
dev = "cpu"
save_model = false
eval_auc = false

[profiles.full]

[profiles.cpu]
gr = 1

[settings.digits]
label = "Digits, 3 clients"
generator = "Digits"
generate = ["noniid", "-", "dir", "--num-clients", "3", "--alpha", "1.0"]

[algorithms.FedAvg]

[algorithms.FedNova]
flags = { local_momentum = 0.5 }

[reference.digits]
FedAvg = 50.0

[check]
curves = "tiny.curves.json"
tolerance = 0.02
"""


def write_suite(tmp_path, text=TINY, name="tiny"):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def cli(tmp_path, *argv):
    return suite.main_cli([argv[0], argv[1], "--results_dir", str(tmp_path / "res"), "--data_dir", str(tmp_path / "data"),
                           *argv[2:]])


@pytest.mark.parametrize("edit,message", [
    (("[suite]\n", "[suite]\ncolour = 'red'\n"), "[suite]: unknown key(s) colour"),
    (('seeds = 1\n', ''), "[suite]: missing seeds"),
    (('label = "Digits, 3 clients"\n', ''), "[settings.digits]: missing label"),
    (("[profiles.full]\n", ""), "missing [profiles.full]"),
    (("FedAvg = 50.0", "FedProx = 50.0"), "[reference.digits]: no algorithm 'FedProx'"),
    (("[reference.digits]", "[reference.mnist]"), "[reference.mnist]: no setting 'mnist'"),
    (('generator = "Digits"', 'generator = "Nope"'), "generator 'Nope': no dataset/generate_Nope.py"),
    (('lr = 0.05', 'learning_rat = 0.05'), "'learning_rat' is not a flag of main.py"),
    (('m = "DNN"', 'data = "MNIST"'), "data is set by the setting's data"),
    (('seeds = 1', 'seeds = "one"'), "seeds must be int"),
    (('metric = "best"', 'metric = "top"'), "metric must be one of best, last, last10, last10pct"),
    (("[check]", "[checks]"), "unknown table(s) checks"),
    (("local_momentum = 0.5", "mu = 0.5"), "[algorithms.FedNova] flags: mu is not a flag of FedNova"),
    (('generator = "Digits"', 'generator = "Digits"\ntarget = "high"'), "[settings.digits]: target must be float"),
    (('generator = "Digits"', 'generator = "Digits"\nprofiles = ["gpu"]'),
     "[settings.digits]: profiles names 'gpu', which is no profile; profiles: full, cpu"),
    (('generator = "Digits"', 'generator = "Digits"\nprofiles = ["full"]'),
     "[profiles.cpu]: no setting runs in it"),
    (('metric = "best"', 'metric = "last10%"'), "metric must be one of best, last, last10, last10pct"),
    (("local_momentum = 0.5", "adafl_frac_step = 5"), "adafl_frac_step is not a flag of FedNova"),
])
def test_bad_suite_files_are_one_line_and_exit_2(tmp_path, capsys, edit, message):
    path = write_suite(tmp_path, TINY.replace(*edit))
    assert cli(tmp_path, "run", str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_bad_shard_and_profile(tmp_path, capsys):
    path = write_suite(tmp_path)
    assert cli(tmp_path, "run", str(path), "--shard", "3/2") == 2
    assert "--shard '3/2': write i/n" in capsys.readouterr().err
    assert cli(tmp_path, "run", str(path), "--profile", "gpu") == 2
    assert "no profile 'gpu'; profiles: full, cpu" in capsys.readouterr().err


def test_shards_partition_the_runs(tmp_path):
    loaded = suite.load_suite(write_suite(tmp_path, TINY.replace("seeds = 1", "seeds = 3")))
    runs = suite.plan(loaded, "full", tmp_path / "res")
    keys = [r.key for r in runs]
    assert keys == [f"digits/{a}/{s}" for a in ("FedAvg", "FedNova") for s in range(3)]
    shards = [[r.key for r in suite.shard(runs, f"{i}/4")] for i in range(1, 5)]
    assert sorted(k for s in shards for k in s) == sorted(keys) and all(shards)


@pytest.fixture
def in_process(monkeypatch):
    """Runs main.py in this process (no interpreter start-up per run); records what ran, and can
    interrupt one run the first time it starts, as Ctrl-C would."""
    ran: list[str] = []
    interrupt: set[str] = set()

    def run(self, job):
        if job.algorithm in interrupt:
            interrupt.discard(job.algorithm)
            raise KeyboardInterrupt
        ran.append(job.algorithm)
        return main.main(job.argv), "", 0.0

    monkeypatch.setattr(sweep.Runner, "run", run)
    return ran, interrupt


def page_row(page: str, algorithm: str) -> list[str]:
    """The algorithm's row in the first profile's table (the published figures come before)."""
    runs = page.split("## Profile", 1)[1]
    row = next(line for line in runs.splitlines() if line.startswith(f"| {algorithm} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_tiny_suite_runs_resumes_renders_and_checks(tmp_path, capsys, in_process):
    ran, interrupt = in_process
    path = write_suite(tmp_path)
    interrupt.add("FedNova")
    assert cli(tmp_path, "run", str(path)) == 130  # FedAvg finished, FedNova interrupted
    assert ran == ["FedAvg"]
    files = sorted((tmp_path / "res").glob("*.h5"))
    assert [f.name for f in files] == ["tiny-digits_FedAvg_full_0.h5"]
    assert cli(tmp_path, "run", str(path)) == 0  # resumed: only the unfinished run
    assert ran == ["FedAvg", "FedNova"]
    assert "2 runs, 1 done earlier, 1 to run" in capsys.readouterr().out
    assert cli(tmp_path, "run", str(path)) == 0 and ran == ["FedAvg", "FedNova"]  # nothing reruns
    assert json.loads((tmp_path / "res" / "machines.json").read_text())  # the machine is recorded

    out = tmp_path / "pages"
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    page = (out / "tiny.md").read_text()
    assert (out / "tiny-full.png").stat().st_size > 0
    assert "## Profile `cpu`" not in page  # no run of that profile yet
    assert "an x marks" not in page  # no run diverged: the figure needs no key for it
    for algorithm in ("FedAvg", "FedNova"):
        with h5py.File(tmp_path / "res" / f"tiny-digits_{algorithm}_full_0.h5", "r") as f:
            acc = f["rs_test_acc"][:]
            seconds = f["rs_round_time"][:]
            up = f["rs_bytes_up"][:]
            reached = f["rs_eval_rounds"][:][np.argmax(acc >= 0.2)]  # the first evaluation at the target
        cells = page_row(page, algorithm)
        assert cells[1] == "1"
        assert cells[2] == f"{100 * acc.max():.2f} ± 0.00"
        assert cells[3] == f"{100 * acc[-1]:.2f} ± 0.00"
        assert cells[4] == f"{100 * acc[1:].mean():.2f} ± 0.00"  # mean of the (fewer than 10) trained evaluations
        assert cells[7] == "–"  # fewer than 20 evaluations: no gain over the last 10
        assert cells[8] == f"{reached:.1f}"
        assert cells[9] == f"{3 * reached:.0f}"  # 3 clients upload in every round before it
        threads = max(1, os.cpu_count() or 1)  # run --jobs 1: one run on every core
        assert cells[11] == f"{seconds.mean():.2f} ({threads} thread{'' if threads == 1 else 's'})"
        assert cells[12].startswith(f"{up.sum() / len(up) / 1e6:.3f} / ")
        assert "global model" in cells[13]
    fedavg = page_row(page, "FedAvg")
    with h5py.File(tmp_path / "res" / "tiny-digits_FedAvg_full_0.h5", "r") as f:
        best = 100 * f["rs_test_acc"][:].max()
    assert fedavg[5] == "50.00" and fedavg[6] == f"{best - 50.0:+.2f}"
    assert page_row(page, "FedNova")[5] == "–"
    assert re.search(r"python system/main.py .*-algo FedNova", page)

    # the CI check: stored curves, then a curve changed beyond the tolerance fails and one within passes
    assert cli(tmp_path, "check", str(path), "--update") == 0
    stored_path = tmp_path / "tiny.curves.json"
    stored = json.loads(stored_path.read_text())
    assert cli(tmp_path, "check", str(path)) == 0
    capsys.readouterr()
    for shift, status in ((0.03, 1), (-0.03, 1), (0.015, 0)):
        mutated = json.loads(json.dumps(stored))
        mutated["curves"]["digits/FedNova/0"][1] += shift
        stored_path.write_text(json.dumps(mutated))
        assert cli(tmp_path, "check", str(path)) == status, shift
    assert "digits/FedNova/0: accuracy at evaluation 1" in capsys.readouterr().err
    del mutated["curves"]["digits/FedAvg/0"]
    stored_path.write_text(json.dumps(mutated))
    assert cli(tmp_path, "check", str(path)) == 1


def test_a_changed_setting_is_a_conflict_not_a_reuse(tmp_path, capsys, in_process):
    ran, _ = in_process
    path = write_suite(tmp_path, TINY.replace("[algorithms.FedNova]\nflags = { local_momentum = 0.5 }\n", ""))
    assert cli(tmp_path, "run", str(path), "--profile", "cpu") == 0 and ran == ["FedAvg"]
    write_suite(tmp_path, TINY.replace("[algorithms.FedNova]\nflags = { local_momentum = 0.5 }\n", "")
                .replace("lr = 0.05", "lr = 0.1"))
    assert cli(tmp_path, "run", str(path), "--profile", "cpu") == 1 and ran == ["FedAvg"]
    assert "conflict" in capsys.readouterr().err


@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_shipped_suites_validate_and_plan(tmp_path, path):
    """Every suite file in suites/ loads (an unknown key fails) and plans in each of its profiles (a flag
    main.py or the algorithm does not know fails)."""
    loaded = suite.load_suite(path)
    for profile in loaded.profiles:
        runs = suite.plan(loaded, profile, tmp_path)
        assert len(runs) == len(loaded.settings_of(profile)) * len(loaded.algorithms) * loaded.seeds > 0
        assert {r.job.state for r in runs} == {"todo"}
    runs = suite.plan(loaded, "full", tmp_path)
    if loaded.check is not None:  # the stored curves are those of exactly these runs
        stored = json.loads((path.parent / loaded.check["curves"]).read_text())["curves"]
        assert sorted(stored) == sorted(r.key for r in runs)


STAND_IN = TINY.replace("[algorithms.FedAvg]", """[settings.small]
label = "Digits, 2 clients (a stand-in)"
generator = "Digits"
generate = ["noniid", "-", "dir", "--num-clients", "2", "--alpha", "1.0"]
profiles = ["cpu"]

[algorithms.FedAvg]""").replace('generate = ["noniid", "-", "dir", "--num-clients", "3", "--alpha", "1.0"]',
                                'generate = ["noniid", "-", "dir", "--num-clients", "3", "--alpha", "1.0"]\nprofiles = ["full"]')


def test_a_setting_runs_only_in_its_profiles(tmp_path):
    loaded = suite.load_suite(write_suite(tmp_path, STAND_IN))
    assert {r.setting.id for r in suite.plan(loaded, "full", tmp_path)} == {"digits"}
    assert {r.setting.id for r in suite.plan(loaded, "cpu", tmp_path)} == {"small"}
    assert loaded.settings_of("cpu")[0].runs_in("cpu") and not loaded.settings_of("cpu")[0].runs_in("full")


def test_an_entrys_own_choices_bring_their_flags(tmp_path):
    """select = "adafl" makes adafl_frac_step a flag of FedMix's entry; without it the flag is refused."""
    text = TINY.replace("[algorithms.FedNova]\nflags = { local_momentum = 0.5 }",
                        '[algorithms.FedMix-adafl]\nalgo = "FedMix"\nflags = { select = "adafl", adafl_frac_step = 5 }')
    runs = suite.plan(suite.load_suite(write_suite(tmp_path, text)), "full", tmp_path)
    argv = next(r.job.argv for r in runs if r.entry.id == "FedMix-adafl")
    assert argv[argv.index("--adafl_frac_step") + 1] == "5" and argv[argv.index("--select") + 1] == "adafl"
    with pytest.raises(suite.FLError, match="adafl_frac_step is not a flag of FedMix"):
        suite.plan(suite.load_suite(write_suite(tmp_path, text.replace('select = "adafl", ', ''))), "full", tmp_path)


def test_last10pct_metric_uploads_to_target_and_the_published_figures(tmp_path, in_process):
    """The reference is compared with the mean of the last 10% of evaluations; uploads to the target
    are the upload counts of the rounds before it; every reference is listed, run or not."""
    text = (STAND_IN.replace('metric = "best"', 'metric = "last10pct"').replace("gr = 1\n", "gr = 2\n")
            .replace("FedAvg = 50.0", "FedAvg = 50.0\n\n[reference.small]\nFedAvg = 40.0\nFedNova = 40.0"))
    path = write_suite(tmp_path, text)
    assert cli(tmp_path, "run", str(path), "--profile", "cpu", "--only", "small/FedAvg/*") == 0
    out = tmp_path / "pages"
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    page = (out / "tiny.md").read_text()
    published = page.split("## Published figures", 1)[1]
    assert "| algorithm | digits | small |" in published and "| FedAvg | 50.00 | 40.00 |" in published
    assert "| FedNova | – | 40.00 |" in published  # listed though FedNova never ran
    assert "compared with *mean of last 10%*" in page
    header = next(line for line in page.splitlines() if line.startswith("| algorithm | seeds"))
    assert "mean of last 10% (cpu)" in header and "uploads to 20%" in header
    cells = page_row(page, "FedAvg")
    with h5py.File(tmp_path / "res" / "tiny-small_FedAvg_cpu_0.h5", "r") as f:
        acc, clients = f["rs_test_acc"][:], f["rs_clients_per_round"][:]
        rounds = f["rs_eval_rounds"][:]
    assert cells[5] == f"{100 * acc[-1]:.2f} ± 0.00"  # 2 trained evaluations: the last 10% is the last one
    assert cells[6] == "40.00" and cells[7] == f"{100 * acc[-1] - 40.0:+.2f}"
    reached = rounds[np.argmax(acc >= 0.2)]
    assert cells[10] == f"{clients[:reached].sum():.0f}"
    assert page_row(page, "FedNova")[2] == "not run"


def test_uploads_to_target_counts_the_rounds_before_it():
    series = {"rs_test_acc": np.array([0.1, 0.3, 0.6]), "rs_clients_per_round": np.array([2.0, 5.0, 7.0])}
    run = suite.RunResult(suite.ROOT, "d", "FedAvg", "g", 0, series, np.array([0, 1, 2]))
    assert suite.uploads_to_target(run, 0.5) == 7.0  # round 2 reaches it: rounds 0 and 1 uploaded 2 + 5
    assert np.isnan(suite.uploads_to_target(run, 0.9))
    del series["rs_clients_per_round"]
    assert suite.uploads_to_target(run, 0.5) is None


def test_stored_runs_render_the_page_again_and_count_as_done(tmp_path, capsys, in_process):
    """``store`` keeps the finished runs beside the suite file; in a checkout without the results
    folder, ``run`` reruns none of them and ``render`` makes the page from them; ``--no-stored``
    ignores them; a stored run that differs is kept unless ``--replace``; ``check`` never reads them."""
    ran, _ = in_process
    path = write_suite(tmp_path)
    assert cli(tmp_path, "store", str(path)) == 2  # nothing finished yet
    assert "no finished run" in capsys.readouterr().err
    assert cli(tmp_path, "run", str(path)) == 0 and ran == ["FedAvg", "FedNova"]
    assert cli(tmp_path, "store", str(path)) == 0
    kept = tmp_path / "runs" / "tiny"
    assert sorted(f.name for f in kept.glob("*.h5")) == ["tiny-digits_FedAvg_full_0.h5", "tiny-digits_FedNova_full_0.h5"]
    assert json.loads((kept / "machines.json").read_text())
    assert cli(tmp_path, "store", str(path)) == 0 and "stored 0 run(s)" in capsys.readouterr().out

    for f in (tmp_path / "res").iterdir():  # a fresh checkout: the results folder is gone
        if f.is_file():
            f.unlink()
    assert cli(tmp_path, "run", str(path)) == 0 and ran == ["FedAvg", "FedNova"]  # nothing reruns
    assert "2 done earlier (2 of them stored in" in capsys.readouterr().out
    out = tmp_path / "pages"
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    page = (out / "tiny.md").read_text()
    assert "behind every number below were stored in" in page and "## Machines" in page and "No machine record" not in page
    with h5py.File(kept / "tiny-digits_FedAvg_full_0.h5", "r") as f:
        best = 100 * f["rs_test_acc"][:].max()
    assert page_row(page, "FedAvg")[2] == f"{best:.2f} ± 0.00"
    assert cli(tmp_path, "check", str(path), "--update") == 2  # the CI check compares runs made here only
    assert "no finished run" in capsys.readouterr().err
    assert cli(tmp_path, "render", str(path), "--out", str(out), "--no-stored") == 2

    assert cli(tmp_path, "run", str(path), "--no-stored", "--only", "digits/FedAvg/*") == 0
    assert ran == ["FedAvg", "FedNova", "FedAvg"]
    before = (kept / "tiny-digits_FedAvg_full_0.h5").read_bytes()
    assert cli(tmp_path, "store", str(path)) == 1  # the rerun's file differs (its times): kept, and said
    assert "1 run(s) differ from the stored ones" in capsys.readouterr().err
    assert (kept / "tiny-digits_FedAvg_full_0.h5").read_bytes() == before
    assert cli(tmp_path, "store", str(path), "--replace") == 0
    assert (kept / "tiny-digits_FedAvg_full_0.h5").read_bytes() == (tmp_path / "res" / "tiny-digits_FedAvg_full_0.h5").read_bytes()

    for f in (tmp_path / "res").glob("*.h5"):
        f.unlink()
    before = len(ran)
    assert cli(tmp_path, "run", str(path), "--check") == 2  # runs here (stored ones do not count), then no curves
    assert ran[before:] == ["FedAvg", "FedNova"]


def test_render_keeps_a_page_whose_runs_it_cannot_see_unless_told(tmp_path, capsys, in_process):
    """A page is not replaced by one with fewer runs of a row (a checkout lacking some of the files
    behind it): one line naming the rows, exit 2, page and figure untouched; ``--drop`` replaces it;
    more runs, or the same, replace it."""
    path = write_suite(tmp_path)
    assert cli(tmp_path, "run", str(path)) == 0
    out = tmp_path / "pages"
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0  # the same runs
    page, figure = (out / "tiny.md").read_text(), (out / "tiny-full.png").read_bytes()
    assert suite.page_rows(page.splitlines()) == {("full", "Digits, 3 clients", "FedAvg"): 1,
                                                  ("full", "Digits, 3 clients", "FedNova"): 1}
    (tmp_path / "res" / "tiny-digits_FedNova_full_0.h5").unlink()
    capsys.readouterr()
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Digits, 3 clients / FedNova (1 seed -> 0, profile full)" in err
    assert "--drop" in err and "FedAvg" not in err
    assert (out / "tiny.md").read_text() == page and (out / "tiny-full.png").read_bytes() == figure
    assert cli(tmp_path, "render", str(path), "--out", str(out), "--drop") == 0
    assert page_row((out / "tiny.md").read_text(), "FedNova")[1:3] == ["0", "not run"]
    assert cli(tmp_path, "run", str(path)) == 0  # FedNova again: a page with more runs replaces it
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    assert page_row((out / "tiny.md").read_text(), "FedNova")[1] == "1"


def test_a_suite_run_recorded_as_diverged_is_done_and_its_row_says_so(tmp_path, capsys, in_process):
    """A suite whose setting diverges by design (``--record_divergence``): the diverged run is a
    result, not a failure: done, never rerun, and its row names the round it diverged in."""
    ran, _ = in_process
    text = TINY.replace("[algorithms.FedNova]\nflags = { local_momentum = 0.5 }",
                        "[algorithms.FedNova]\nflags = { lr = 1e30, record_divergence = true }")
    path = write_suite(tmp_path, text)
    assert cli(tmp_path, "run", str(path)) == 0 and ran == ["FedAvg", "FedNova"]
    capsys.readouterr()
    assert cli(tmp_path, "run", str(path)) == 0 and ran == ["FedAvg", "FedNova"]  # nothing rerun
    assert "2 done earlier, 0 to run, 0 failed" in capsys.readouterr().out
    out = tmp_path / "pages"
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    (file,) = (tmp_path / "res").glob("*FedNova*.h5")
    diverged = int(read_results(file)["attrs"]["diverged_round"])
    page = (out / "tiny.md").read_text()
    assert page_row(page, "FedNova")[1] == f"1 (1 diverged, in round {diverged})"
    assert page_row(page, "FedAvg")[1] == "1"
    assert "an x marks a run's last evaluation before it diverged" in page
    assert suite.page_rows(page.splitlines())[("full", "Digits, 3 clients", "FedNova")] == 1
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0  # the guard reads the row's seeds


def test_a_rows_curve_goes_on_over_the_runs_still_going_after_one_diverges():
    """The figure's line of a row is the mean over the runs that have each evaluation: a seed that
    diverged early does not cut the row's curve short (it is drawn dashed from there)."""
    def run(acc):
        return SimpleNamespace(n_evals=len(acc), eval_rounds=np.arange(len(acc)) * 2,
                               series={"rs_test_acc": np.asarray(acc)})
    rounds, acc, counts = suite.mean_curve(suite.Cell([run([0.1, 0.5, 0.7, 0.8]), run([0.1, 0.3]),
                                                       run([0.1, 0.4, 0.6])]))
    assert rounds.tolist() == [0, 2, 4, 6] and counts.tolist() == [3, 3, 2, 1]
    assert np.allclose(acc, [0.1, 0.4, 0.65, 0.8])


def test_seconds_per_round_name_the_threads_the_runs_had():
    """A page's s/round says on how many intra-op threads the runs measured it (``run --jobs N``
    gives each of N runs one), so rows timed with other thread counts are not compared blindly."""
    def cell(*threads):
        runs = [SimpleNamespace(config={"num_threads": t}) for t in threads]
        return suite.Cell(runs, SimpleNamespace(stats={"s_per_round": suite.Stat(12.345, 0.0, len(runs))}))
    assert suite.seconds_per_round(cell(1, 1)) == "12.35 (1 thread)"
    assert suite.seconds_per_round(cell(2)) == "12.35 (2 threads)"
    assert suite.seconds_per_round(cell(1, 2)) == "12.35 (1/2 threads)"
    assert suite.seconds_per_round(cell(0, 0)) == "12.35"  # PyTorch's default: one per core
    assert suite.seconds_per_round(suite.Cell([SimpleNamespace(config={"num_threads": 1})],
                                              SimpleNamespace(stats={}))) == "–"


def test_each_run_names_its_machine_and_a_page_from_several_says_which_ran_where(tmp_path, capsys, in_process):
    """Every result file records the machine it was made on; a page whose runs come from two machines
    (stored runs add up across machines) lists both and names them beside each row's s/round; a
    file without a record is taken from the folder's single machines.json entry."""
    path = write_suite(tmp_path)
    assert cli(tmp_path, "run", str(path)) == 0
    files = {algo: tmp_path / "res" / f"tiny-digits_{algo}_full_0.h5" for algo in ("FedAvg", "FedNova")}
    with h5py.File(files["FedAvg"], "r") as f:
        here = json.loads(f.attrs["machine"])
    assert here == suite.machine_record() and here["torch"] and here["cores"] == os.cpu_count()
    out = tmp_path / "pages"
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    page = (out / "tiny.md").read_text()
    assert "- `A` (2 runs): " + here["cpu"] in page and "`B`" not in page
    assert "on A" not in page_row(page, "FedAvg")[11]  # one machine: nothing to tell apart

    other = {**here, "cpu": "Another CPU", "cores": 64}
    with h5py.File(files["FedNova"], "a") as f:
        f.attrs["machine"] = json.dumps(other)
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    page = (out / "tiny.md").read_text()
    assert "- `A` (1 run): " + here["cpu"] in page and "- `B` (1 run): Another CPU (64 cores" in page
    assert page_row(page, "FedAvg")[11].endswith(", on A)") and page_row(page, "FedNova")[11].endswith(", on B)")

    with h5py.File(files["FedNova"], "a") as f:  # a file written before files named their machine
        del f.attrs["machine"]
    assert cli(tmp_path, "render", str(path), "--out", str(out)) == 0
    assert "- `A` (2 runs): " in (out / "tiny.md").read_text()  # machines.json names this machine alone
    capsys.readouterr()


def test_status_counts_the_seeds_done_and_estimates_what_is_left(tmp_path, capsys, in_process):
    """``status`` runs nothing; it counts each cell's finished seeds (stored ones included), names a
    failed run, and estimates the runs left from the finished runs' seconds a round times their rounds."""
    ran, _ = in_process
    path = write_suite(tmp_path)
    assert cli(tmp_path, "status", str(path), "--profile", "full") == 0
    out = capsys.readouterr().out
    assert "tiny (full): 0 of 2 runs done (0 of them stored in " in out
    assert re.search(r"FedAvg\s+0/1\n  FedNova\s+0/1\n", out) and "no finished run to estimate the time from" in out
    assert cli(tmp_path, "status", str(path), "--profile", "nope") == 2
    assert "no profile 'nope'; profiles: full, cpu" in capsys.readouterr().err

    assert cli(tmp_path, "run", str(path), "--only", "digits/FedAvg/*") == 0 and ran == ["FedAvg"]
    capsys.readouterr()
    assert cli(tmp_path, "status", str(path)) == 0 and ran == ["FedAvg"]  # nothing ran
    out = capsys.readouterr().out
    assert "tiny (full): 1 of 2 runs done (0 of them stored in " in out and "), 1 to run" in out and "tiny (cpu): 0 of 2" in out
    assert re.search(r"FedAvg\s+1/1\n  FedNova\s+0/1\n", out)
    with h5py.File(tmp_path / "res" / "tiny-digits_FedAvg_full_0.h5", "r") as f:
        seconds = 2 * f["rs_round_time"][:].mean()  # FedNova's 2 rounds at FedAvg's seconds (same setting)
    assert f"left: about {seconds:.0f} s one run at a time" in out.split("tiny (cpu)")[0]
    assert cli(tmp_path, "store", str(path)) == 0
    capsys.readouterr()
    assert cli(tmp_path, "status", str(path), "--profile", "full") == 0
    assert "1 of 2 runs done (1 of them stored in " in capsys.readouterr().out
    write_suite(tmp_path, TINY.replace("lr = 0.05", "lr = 0.06"))  # the file FedAvg made no longer matches
    assert cli(tmp_path, "status", str(path), "--profile", "full") == 0
    out = capsys.readouterr().out
    assert re.search(r"FedAvg\s+0/1!\n", out) and "digits/FedAvg/0: conflict" in out and "1 failed or in conflict" in out


@pytest.mark.parametrize("target", [True, False])
def test_last_10_gain_shows_a_run_still_learning_where_it_stopped(tmp_path, target):
    """The gain column: the last 10 evaluations' mean minus the 10 before, in signed points, mean ±
    std over the seeds; a run stopped while climbing shows it, a converged one about 0. A setting
    without a target has no to-target columns."""
    loaded = suite.load_suite(write_suite(tmp_path, TINY if target else TINY.replace("target = 0.2\n", "")))
    setting, entries = loaded.settings[0], loaded.algorithms
    rounds = np.arange(21)
    climbing = [np.concatenate([[0.1], np.linspace(0.5, 0.69, 20)]),
                np.concatenate([[0.1], np.linspace(0.5, 0.71, 20)])]
    flat = [np.concatenate([[0.1], np.full(20, 0.8)])]

    def cell(series):
        runs = [suite.RunResult(suite.ROOT, "d", "FedAvg", "g", i, {"rs_test_acc": acc}, rounds,
                                config={"num_clients": 3}) for i, acc in enumerate(series)]
        return suite.Cell(runs, suite.summarize_runs(runs, avg_last=10))
    lines = suite.render_profile(loaded, "full", {(setting.id, entries[0].id): cell(climbing),
                                                  (setting.id, entries[1].id): cell(flat)})
    page = "\n".join(["## Profile", *lines])
    header = next(line for line in lines if line.startswith("| algorithm | seeds"))
    column = [c.strip() for c in header.strip("|").split("|")].index("last 10 gain")
    gains = [acc[-10:].mean() - acc[-20:-10].mean() for acc in climbing]
    assert page_row(page, entries[0].id)[column] == f"{100 * np.mean(gains):+.2f} ± {100 * np.std(gains):.2f}"
    assert page_row(page, entries[1].id)[column] == "+0.00 ± 0.00"
    assert ("uploads to 20%" in header) == target and ("rounds" in header) == target
    assert len(page_row(page, entries[0].id)) == header.count("|") - 1  # every row fills the header


@pytest.mark.skipif(not (suite.ROOT / ".git").exists(), reason="not a git checkout")
def test_stored_runs_and_scratch_results_are_ignored_by_git():
    """Result files never enter git: the runs behind a page (``suites/runs/``) travel by copying the
    folder, like every result in ``results/``."""
    def ignored(name: str) -> bool:
        done = subprocess.run(["git", "check-ignore", "-q", name], cwd=suite.ROOT)
        assert done.returncode in (0, 1), f"git check-ignore failed on {name}"
        return done.returncode == 0
    assert ignored("suites/runs/niid_bench/niid-bench-MNIST-iid_FedAvg_full_0.h5")
    assert ignored("suites/runs/niid_bench/machines.json")
    assert ignored("results/niid_bench/niid-bench-MNIST-iid_FedAvg_full_0.h5")
