"""A run's memory stays flat: 250 toy rounds through ``main.main`` with the soak benchmark's sampler
(``experiments/soak.py``), the resident set's growth from round 100 on under
``GROWTH_BOUND_KB_PER_ROUND`` (what a run keeps per round, its history, is well under 2 KiB; a
tensor of 32 KiB kept each round measures about 34 KiB a round and fails), and the sampler's
slope by hand."""
from __future__ import annotations

import sys

import pytest
from conftest import REPO
from toydata import make_dataset

sys.path.insert(0, str(REPO / "experiments"))
import soak  # noqa: E402


def test_growth_is_the_least_squares_slope():
    samples = [{"round": r, "rss_mb": 100 + 0.5 * r + (0.1 if r == 200 else 0), "gpu_mb": None}
               for r in (100, 200, 300)]
    assert soak.growth_per_round(samples, "rss_mb") == pytest.approx(0.5)
    assert soak.growth_per_round(samples, "gpu_mb") is None
    assert soak.growth_per_round(samples[:1], "rss_mb") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_does_not_grow_per_round(tmp_path):
    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(4,))
    samples = soak.sampled_run(["-data", str(data), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-m", "MLR",
                                "--engine", "sequential", "-gr", "250", "-lbs", "8", "--progress", "False", "-q",
                                "True"], every=25)
    assert [s["round"] for s in samples] == list(range(25, 251, 25))
    steady = [s for s in samples if s["round"] >= 100]  # the first rounds load libraries and fill caches
    growth_kb = 1024 * soak.growth_per_round(steady, "rss_mb")
    assert growth_kb < soak.GROWTH_BOUND_KB_PER_ROUND, [round(s["rss_mb"], 2) for s in samples]
