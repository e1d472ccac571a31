"""experiments/pfllib_scale.py: its refusals are one line with exit status 2, and PFLlib's progress
is read from its timestamped lines (no PFLlib run here)."""
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import pfllib_scale  # noqa: E402


@pytest.mark.parametrize("extra, start", [
    ([], "error: --pfllib"),
    (["--join-ratio", "0"], "error: --clients must be"),
    (["--clients", "100", "--join-ratio", "0.001"], "error: --join-ratio times --clients"),
    (["--eval_clients", "0"], "error: --eval_clients"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, extra, start):
    checkout = tmp_path / "pfllib"
    if extra:
        (checkout / "system").mkdir(parents=True)
        (checkout / "system" / "main.py").write_text("")
    assert pfllib_scale.main(["--pfllib", str(checkout), "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_stopped_pfllib_run_says_how_far_it_got():
    lines = [(1.0, "Creating server and clients ..."), (40.5, "Finished creating server and clients."),
             (40.6, "-------------Round number: 0-------------"),
             (90.0, "------------------------- time cost ------------------------- 49.4"),
             (90.1, "-------------Round number: 1-------------"), (120.0, "Evaluate global model")]
    figures = pfllib_scale.pfllib_figures({"lines": lines})
    assert figures["startup_s"] == 40.5 and figures["round_s"] == [49.4]
    assert figures["rounds_done"] == 1 and figures["rounds_started"] == 2
    assert figures["last_line"] == "Evaluate global model"
