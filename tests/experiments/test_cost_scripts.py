"""experiments/algorithm_cost.py's rows and experiments/same_numbers.py's input checks (no training here)."""
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import algorithm_cost  # noqa: E402
import same_numbers  # noqa: E402
from flcore.registry import ALGORITHMS, load_all  # noqa: E402
import main  # noqa: E402


def test_variant_rows_name_registered_algorithms_and_flags_they_take():
    load_all()
    for label, (algo, flags) in algorithm_cost.VARIANTS.items():
        assert algo in ALGORITHMS and label not in ALGORITHMS, label
        args = main.parse_args(["-algo", algo, "-m", "CNN", *flags, *algorithm_cost.NEEDS.get(algo, [])])
        assert getattr(args, main.IGNORED_DEST) == [], label  # main would ignore them with an info line


def test_same_numbers_refuses_bad_input_with_status_2(capsys):
    assert same_numbers.main(["--against", "no-such-commit-anywhere", "FedAvg"]) == 2
    assert "no such commit" in capsys.readouterr().err
    assert same_numbers.main(["--against", "HEAD", "FedAvg", "--flags", "mu"]) == 2
    assert "name=value" in capsys.readouterr().err
