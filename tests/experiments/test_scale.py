"""experiments/scale.py end to end on a tiny population: its rows come from real runs."""
import json
import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import scale  # noqa: E402


@pytest.mark.skipif(not Path("/usr/bin/time").is_file(), reason="GNU time (/usr/bin/time) is not installed")
def test_a_tiny_population_gives_a_row_of_measurements(tmp_path, capsys):
    assert scale.main(["--populations", "40", "--cohorts", "4", "--models", "MLR", "--rounds", "2",
                       "--eval_clients", "10", "--dim", "4", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "scale.json").read_text())
    (generated,), (run,) = rows["generated"], rows["runs"]
    assert generated["population"] == 40 and generated["gen_s"] > 0 and generated["gen_rss_mb"] > 10
    assert run["startup_s"] > 0 and run["run_rss_mb"] > 10 and run["round_s"] > 0
    # the private memory is sampled from the python process under GNU time: torch alone is more than 50 MB
    assert 50 < run["run_private_mb"] <= run["run_rss_mb"] and 10 < generated["gen_private_mb"] <= generated["gen_rss_mb"]
    assert "| 40 | 4 | MLR |" in capsys.readouterr().out
    assert scale.main(["--populations", "40", "--cohorts", "4", "--models", "MLR", "--rounds", "2",
                       "--eval_clients", "10", "--dim", "4", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "scale.json").read_text())["generated"][0]["gen_s"] is None  # reused


def test_bad_arguments_are_one_line(capsys):
    assert scale.main(["--rounds", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: --rounds must be at least 2")
