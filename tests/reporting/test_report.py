"""report.py: one self-contained HTML page over a results folder (ours and PFLlib-style files)."""
from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import report
from resultfiles import FEDAVG, write_folder, write_pfllib

SYSTEM = Path(__file__).resolve().parents[2] / "system"


def embedded_images(page: str) -> list[Image.Image]:
    uris = re.findall(r'<img src="([^"]+)"', page)
    assert uris and all(uri.startswith("data:image/png;base64,") for uri in uris)
    return [Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) for uri in uris]


def test_page_is_self_contained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = write_folder(tmp_path / "results")
    out = tmp_path / "page.html"
    assert report.main(["--results_dir", str(results), "--out", str(out), "--target_acc", "0.8"]) == 0
    assert str(out) in capsys.readouterr().out
    page = out.read_text()
    # Nothing is fetched: no URL, no external script, style sheet or font.
    assert not re.search(r"(?:src|href)=[\"'](?!data:)", page)
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    images = embedded_images(page)
    # Per dataset: the 2x3 curve grid and the client accuracy distribution.
    assert len(images) == 4
    for picture in images:
        assert picture.format == "PNG" and picture.width > 300 and picture.height > 200
        pixels = np.asarray(picture.convert("L"))
        assert pixels.std() > 10  # drawn, not blank
    # The table, with the same cells as summarize.py, for every dataset.
    best = 100 * np.max(FEDAVG, axis=1)
    assert f"<td>{best.mean():.2f} ± {best.std():.2f}</td>" in page
    assert "<td>Cifar10</td>" not in page and "<h2>Cifar10</h2>" in page and "<h2>MNIST</h2>" in page
    assert "rounds to 80%" in page and "personal models" in page and "UNFINISHED" in page


def test_page_holds_each_configuration_and_the_notes(tmp_path: Path) -> None:
    results = write_folder(tmp_path / "results")
    assert report.main(["--results_dir", str(results)]) == 0
    page = (results / "report.html").read_text()
    # Every run's configuration (the JSON attribute, escaped), PFLlib files saying they have none.
    assert page.count("<details>") == 8
    assert "&quot;local_learning_rate&quot;: 0.05" in page
    assert page.count("no configuration stored") == 2
    # How every figure was computed.
    for phrase in ("round 0 is never counted", "population std", "rs_round_time over training rounds 0..r-1",
                   "rs_bytes_up", "last row of rs_client_acc", "rs_test_acc_global"):
        assert phrase in page, phrase


def test_pfllib_files_alone(tmp_path: Path) -> None:
    for run in range(2):
        write_pfllib(tmp_path, "Cifar10", "FedALA", "test", run, [0.1, 0.2 + run / 10, 0.4])
    assert report.main(["--results_dir", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert len(embedded_images(page)) == 1  # no per-client accuracies in PFLlib's files
    assert "No run stores per-client accuracies" in page and "(their files have no rs_round_time, e.g. PFLlib's): FedALA" in page


def test_errors_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "report.py", "--results_dir", str(tmp_path / "none")],
                          cwd=SYSTEM, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "none").exists()


def test_configuration_block_escapes_html(tmp_path: Path) -> None:
    results = write_folder(tmp_path / "results")
    import h5py
    with h5py.File(results / "MNIST_FedAvg_test_0.h5", "a") as handle:
        handle.attrs["config"] = json.dumps({"goal": "<script>alert(1)</script>"})
    assert report.main(["--results_dir", str(results)]) == 0
    page = (results / "report.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_an_algorithm_keeps_its_colour_in_every_panel(tmp_path: Path) -> None:
    from reporting.loading import find_all_runs

    groups = find_all_runs(write_folder(tmp_path / "results"))["MNIST"]
    figure = report.curves_figure("MNIST", {algorithm: runs for (algorithm, _), runs in groups.items()})
    colours: dict[str, set[str]] = {}
    for axes in figure.axes:
        for line in axes.get_lines():
            colours.setdefault(line.get_label().split(" (")[0].split(",")[0], set()).add(line.get_color())
    # FedAvg alone is on the virtual-time panels (only its files carry the clock): still its colour.
    assert set(colours) == {"Ditto", "FedAvg", "FedProx"}
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == 3
