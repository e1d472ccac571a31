"""The HTML report opened in headless Chromium: its embedded images really render.

A screenshot of the page is checked by pixel statistics: the matplotlib colours of the curves
(C0 blue, C1 orange) cover many pixels. The same page with its images' data replaced by a
broken PNG (what a browser shows as broken-image icons or alt text) fails that check, so the
check can fail. Chromium is Debian's ``chromium`` package (``.ci/run`` installs it when run as
root); the test skips where it is absent. The browser is kept off every network: no proxy but a
closed local port, no host name resolves, no background traffic.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import report
from resultfiles import write_folder

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                                          "(Debian: apt-get install chromium)")
# matplotlib's first two colours, in which the first two algorithms' curves and dots are drawn.
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)
BROKEN_PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="


def screenshot(page: Path, tmp_path: Path) -> np.ndarray:
    shot = tmp_path / f"{page.stem}.png"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}", "--no-first-run", "--disable-extensions",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
        "--window-size=1400,2600", f"--screenshot={shot}", page.resolve().as_uri(),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}"
    return np.asarray(Image.open(shot).convert("RGB")).astype(int)


def pixels_near(image: np.ndarray, color: tuple[int, int, int], tolerance: int = 40) -> int:
    return int((np.abs(image - np.array(color)).sum(axis=2) < tolerance).sum())


def test_report_images_render_in_chromium(tmp_path: Path) -> None:
    results = write_folder(tmp_path / "results")
    page = tmp_path / "report.html"
    assert report.main(["--results_dir", str(results), "--out", str(page), "-data", "MNIST"]) == 0
    image = screenshot(page, tmp_path)
    assert image.shape[0] >= 2000 and image.shape[1] >= 1300
    blue, orange = pixels_near(image, BLUE), pixels_near(image, ORANGE)
    assert blue > 1000 and orange > 1000, (blue, orange)
    # Not a blank page either: plenty of ink of every sort.
    assert (image.sum(axis=2) < 600).mean() > 0.02

    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r'src="data:image/png;base64,[^"]+"', f'src="{BROKEN_PNG}"', page.read_text()))
    control = screenshot(broken, tmp_path)
    left = pixels_near(control, BLUE), pixels_near(control, ORANGE)
    assert left[0] < blue / 10 and left[1] < orange / 10, (left, blue, orange)
