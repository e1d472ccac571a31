"""benchmark.py end to end on a small P3 (a smoke run: the script's figures come from real runs)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SYSTEM = Path(__file__).resolve().parents[2] / "system"


def test_p3_smoke_run_with_state_on_disk_writes_the_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "benchmark.py", "--only", "P3", "--quick", "--p2-clients", "20", "--engines", "sequential",
         "threaded", "--threads", "1", "--fill-state", "--state-device", "disk", "--out", str(out)],
        cwd=SYSTEM, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "P3   sequential" in done.stdout and "threaded/sequential" in done.stdout
    assert "MB on disk for 20 clients" in done.stdout
    results = json.loads(out.read_text())["results"]
    assert [r["engine"] for r in results] == ["sequential", "threaded"]
    for r in results:
        assert r["algorithm"] == "SCAFFOLD" and r["clients"] == 20 and r["timed_rounds"] == 2
        assert r["state_store"] == "DiskStateStore" and r["state_resident_mb"] == 0
        assert r["clients_with_state"] == 20  # --fill-state: every client has its control variate
        assert abs(r["state_mb"] - 20 * r["model_mb"]) < 1e-6
        assert r["s_per_round"] > 0 and r["peak_rss_mb"] > 0
    # the threaded engine gives the sequential engine's numbers (one intra-op thread each)
    assert results[0]["test_acc"] == results[1]["test_acc"]
