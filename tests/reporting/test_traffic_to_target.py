"""The report's traffic to the target: what was sent (``rs_bytes_up``) and what arrived
(``rs_bytes_up_arrived``, absent from files written before it)."""
from __future__ import annotations

from reporting.loading import load_run
from reporting.stats import run_figures
from resultfiles import write_ours


def test_the_report_gives_what_was_sent_and_what_arrived_before_the_target(tmp_path):
    # 4 rounds of 1 MB sent; 0.5, 1, 1, 1 MB arrived; the target 0.5 is first reached at round 3
    path = write_ours(tmp_path, "Toy", "FedAsync", "test", 0, [0.1, 0.2, 0.3, 0.5, 0.6], bytes_up=1_000_000,
                      extra_series={"rs_bytes_up_arrived": [500_000, 1_000_000, 1_000_000, 1_000_000]})
    figures = run_figures(load_run(path), target_acc=0.5)
    assert figures["rounds_to_target"] == 3
    assert figures["mb_to_target"] == 3.0 and figures["mb_arrived_to_target"] == 2.5
    older = write_ours(tmp_path, "Toy", "FedAvg", "test", 0, [0.1, 0.5])  # written before the series
    assert run_figures(load_run(older), target_acc=0.5)["mb_arrived_to_target"] is None
