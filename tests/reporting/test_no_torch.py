"""Reporting never imports torch or flcore: plotting and summarising work on a machine with only
h5py, numpy and matplotlib, and stay fast."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from resultfiles import write_folder

SYSTEM = Path(__file__).resolve().parents[2] / "system"

SCRIPT = """
import sys
sys.path.insert(0, {system!r})
import pkgutil, importlib, reporting
for module in pkgutil.iter_modules(reporting.__path__):
    importlib.import_module("reporting." + module.name)
import plot, report, summarize
results = {results!r}
codes = [
    plot.main(["-data", "MNIST", "-algo", "FedAvg", "Ditto", "FedProx", "--results_dir", results,
               "--out", {out!r}, "--metric", "acc", "time"]),
    plot.main(["-data", "MNIST", "-algo", "NoSuchAlgo", "--results_dir", results]),  # names the algorithms
    summarize.main(["--results_dir", results, "--csv", "", "--md", ""]),
    report.main(["--results_dir", results, "--out", {page!r}]),
]
assert codes == [0, 2, 0, 0], codes
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "flcore"))
print("LOADED", loaded)
"""


def test_plot_summarize_and_report_never_import_torch_or_flcore(tmp_path: Path) -> None:
    results = write_folder(tmp_path / "results")
    script = SCRIPT.format(system=str(SYSTEM), results=str(results), out=str(tmp_path / "png"),
                           page=str(tmp_path / "page.html"))
    proc = subprocess.run([sys.executable, "-c", script], cwd=SYSTEM, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout, proc.stdout
    assert (tmp_path / "png" / "MNIST_test_acc.png").is_file() and (tmp_path / "page.html").is_file()


def test_algorithm_names_read_as_text_are_the_registry() -> None:
    from flcore.registry import ALGORITHMS, load_all
    from reporting.names import known_algorithms

    load_all()
    assert known_algorithms() == sorted(ALGORITHMS.names())
