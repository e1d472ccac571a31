"""Result-file names: ``<dataset>_<algorithm>_<goal>_<run>.h5`` (PFLlib's naming), and how to
make the files a search did not find.

``dataset`` is always the dataset's folder name, never a path: ``main.py -data /data/Digits``
writes ``Digits_FedAvg_test_0.h5``, so the tools find it with ``-data /data/Digits`` too
(:func:`dataset_name`).
"""
from __future__ import annotations

import re
from pathlib import Path

from utils.errors import FLError

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVERS = REPO_ROOT / "system" / "flcore" / "servers"
#: A result file name: the dataset and algorithm hold no underscore (the algorithm may hold
#: ``-``), the goal may, the run is the trailing integer.
NAME = re.compile(r"([^_]+)_([^_]+)_(.+)_(\d+)\.h5")


def dataset_name(dataset: str) -> str:
    """The name part main.py gives a ``-data`` value: the last component of a path.

    Raises:
        FLError: The value names no folder (``''``, ``.``, ``..``).
    """
    name = Path(dataset).name
    if name in ("", ".", ".."):
        raise FLError(f"-data {dataset!r} names no dataset; give its name (MNIST) or its folder")
    return name


def result_file_name(dataset: str, algorithm: str, goal: str, run: int | str) -> str:
    """The file name PFLlib gives a run: ``<dataset>_<algorithm>_<goal>_<run>.h5``."""
    return f"{dataset}_{algorithm}_{goal}_{run}.h5"


def search_pattern(results_dir: Path | str, dataset: str, algorithm: str, goal: str) -> str:
    """Human-readable pattern of the files searched, e.g. ``../results/MNIST_FedAvg_test_<run>.h5``."""
    return str(Path(results_dir) / result_file_name(dataset, algorithm, goal, "<run>"))


def parse_result_name(name: str) -> tuple[str, str, str, int] | None:
    """``(dataset, algorithm, goal, run)`` of a file name such as ``MNIST_IGFL-S_test_x_2.h5``,
    or None when the name does not have that shape."""
    match = NAME.fullmatch(name)
    if match is None:
        return None
    return match.group(1), match.group(2), match.group(3), int(match.group(4))


def find_runs(results_dir: Path | str, dataset: str, algorithm: str, goal: str) -> list[Path]:
    """Result files of every run (``-t`` repeat) of one algorithm, in run order (a folder of such
    a name too: the caller says it is left out); empty when there are none (or no such folder). Names are matched literally: ``FedAvg`` does not pick up
    ``FedAvg-S`` nor goal ``test`` pick up goal ``test_2``."""
    folder = Path(results_dir)
    if not folder.is_dir():
        return []
    pattern = re.compile(re.escape(f"{dataset}_{algorithm}_{goal}_") + r"(\d+)\.h5")
    found = [(int(m.group(1)), path) for path in folder.iterdir() if (m := pattern.fullmatch(path.name))]
    return [path for _, path in sorted(found)]


def algorithms_with_results(results_dir: Path | str, dataset: str, goal: str) -> list[str]:
    """Algorithm names that have result files for ``dataset`` and ``goal`` (by file name)."""
    folder = Path(results_dir)
    if not folder.is_dir():
        return []
    pattern = re.compile(re.escape(f"{dataset}_") + r"([^_]+)" + re.escape(f"_{goal}_") + r"\d+\.h5")
    return sorted({m.group(1) for p in folder.iterdir() if (m := pattern.fullmatch(p.name))})


def known_algorithms() -> list[str]:
    """The names registered with ``@register_algorithm("...")`` in ``flcore/servers/``, read as
    text: importing the registry would import torch, which reporting never does
    (``tests/reporting/test_no_torch.py`` checks both agree)."""
    decorator = re.compile(r"""^@register_algorithm\(\s*["']([^"']+)["']""", re.MULTILINE)
    return sorted({name for path in SERVERS.glob("*.py")
                   for name in decorator.findall(path.read_text(encoding="utf-8"))})


def creation_command(dataset: str, algorithm: str, goal: str) -> str:
    """How to make such result files, naming only commands that exist: the ``main.py`` command
    (from ``system/``) when ``algorithm`` is registered, preceded by the dataset's generator when
    the dataset is not generated yet; otherwise what is missing. ``dataset`` as the user gave it."""
    known = known_algorithms()
    if algorithm not in known:
        return (f"no algorithm {algorithm!r} in this platform, so main.py cannot make them "
                f"(algorithms: {', '.join(known)})")
    command = f"`python main.py -data {dataset} -algo {algorithm}{'' if goal == 'test' else f' -go {goal}'}`"
    datasets = REPO_ROOT / "dataset"
    if Path(dataset).name != dataset or (datasets / dataset / "config.json").is_file():  # a folder given by path: nothing to generate
        return f"create them with {command} (from system/)"
    generator = datasets / f"generate_{dataset}.py"
    if generator.is_file():
        return (f"create them with `python {generator.name} ...` (from dataset/, see dataset/README.md), "
                f"then {command} (from system/)")
    generators = sorted(p.stem[len("generate_"):] for p in datasets.glob("generate_*.py"))
    return (f"create them with {command} (from system/) once dataset/{dataset} exists (no "
            f"generate_{dataset}.py; generators: {', '.join(generators)})")
