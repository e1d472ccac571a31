"""A run's memory stays flat: 250 toy rounds through ``main.main`` with the soak benchmark's sampler
(``experiments/soak.py``), the resident set's typical growth between samples from round 100 on
under ``GROWTH_BOUND_KB_PER_ROUND`` (what a run keeps per round, its history, is well under 2 KiB),
the same run keeping a 32 KiB tensor each round measured over the bound, and the sampler's
slopes by hand."""
from __future__ import annotations

import json
import subprocess
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


def test_typical_growth_is_the_median_interval_and_ignores_one_step():
    steady = [{"round": r, "rss_mb": 100 + 0.5 * r, "gpu_mb": None} for r in range(100, 260, 25)]
    assert soak.typical_growth_per_round(steady, "rss_mb") == pytest.approx(0.5)
    stepped = [{"round": r, "rss_mb": 755.25 + (3.2 if r > 150 else 0), "gpu_mb": None} for r in range(100, 260, 25)]
    assert soak.typical_growth_per_round(stepped, "rss_mb") == 0  # the least-squares slope is ~23 KiB a round
    assert 1024 * soak.growth_per_round(stepped, "rss_mb") > soak.GROWTH_BOUND_KB_PER_ROUND
    assert soak.typical_growth_per_round(steady, "gpu_mb") is None
    assert soak.typical_growth_per_round(steady[:1], "rss_mb") is None


SAMPLED = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import soak, torch
from flcore.servers.serverbase import Server
kept, original = [], Server.run_round
def leaking(self, *args, **kwargs):
    kept.append(torch.ones(8 * 1024))  # 32 KiB, touched
    return original(self, *args, **kwargs)
if sys.argv[3] == "leak":
    Server.run_round = leaking
samples = soak.sampled_run(sys.argv[4:], every=10)
print(json.dumps({"samples": samples, "kept": len(kept)}))
"""


def steady_growth_kb(tmp_path, leak: bool) -> tuple[float, int, list[float]]:
    """250 toy rounds in a fresh process (the heap of a process that has run other things absorbs
    what a run keeps, and hides a leak); the typical growth from round 100 on in KiB per round, the
    tensors kept, and every sample's resident set (MiB)."""
    data = make_dataset(tmp_path / "data", num_clients=2, input_shape=(4,))
    argv = ["-data", str(data), "--results_dir", str(tmp_path / "res"), "-dev", "cpu", "-m", "MLR", "--engine",
            "sequential", "-gr", "250", "-lbs", "8", "--progress", "False", "-q", "True", "--num_threads", "1"]
    done = subprocess.run([sys.executable, "-c", SAMPLED, str(REPO / "system"), str(REPO / "experiments"),
                           "leak" if leak else "clean", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    samples = record["samples"]
    assert [s["round"] for s in samples] == list(range(10, 251, 10))
    steady = [s for s in samples if s["round"] >= 100]  # the first rounds load libraries and fill caches
    return 1024 * soak.typical_growth_per_round(steady, "rss_mb"), record["kept"], [round(s["rss_mb"], 2)
                                                                                     for s in samples]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_does_not_grow_per_round(tmp_path):
    growth_kb, _, rss = steady_growth_kb(tmp_path, leak=False)
    assert growth_kb < soak.GROWTH_BOUND_KB_PER_ROUND, rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_tensor_kept_each_round_is_measured_over_the_bound(tmp_path):
    growth_kb, kept, rss = steady_growth_kb(tmp_path, leak=True)
    assert kept == 251  # rounds 0 to -gr, as PFLlib counts them
    assert growth_kb > soak.GROWTH_BOUND_KB_PER_ROUND, rss
