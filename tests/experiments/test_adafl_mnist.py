"""experiments/adafl_mnist.py: its rows, the paper's numbers beside them, and which rows get AdaFL's
fraction schedule (no run here)."""
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import adafl_mnist  # noqa: E402
from flcore.registry import ALGORITHMS, load_all  # noqa: E402


def test_every_row_is_registered_and_has_the_papers_numbers():
    load_all()
    for label, algo, _ in adafl_mnist.VARIANTS:
        assert algo in ALGORITHMS, label
        assert label in adafl_mnist.PAPER, label


def test_table_3s_fedmix_rows_differ_only_in_selection():
    rows = {label: (algo, flags) for label, algo, flags in adafl_mnist.VARIANTS}
    assert rows["FedMix 0.1"] == ("FedMix", ["-jr", "0.1"]) and rows["FedMix 0.5"] == ("FedMix", ["-jr", "0.5"])
    assert rows["AdaFL+FedMix"] == ("FedMix", ["--select", "adafl"])


def test_the_fraction_schedule_goes_to_every_row_with_adafls_selection():
    chosen = [label for label, algo, flags in adafl_mnist.VARIANTS if adafl_mnist.selects_adafl(algo, flags)]
    assert chosen == ["Attn. 0.1", "Attn. 0.5", "Dyn. FedAvg", "AdaFL", "AdaFL+FedMix"]
    assert not adafl_mnist.selects_adafl("FedMix", ["--select", "uniform", "-jr", "0.1"])
    assert not adafl_mnist.selects_adafl("FedMix", ["adafl"])  # a value alone is no selection
