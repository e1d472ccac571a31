"""The generators' helpers have a name of their own (``datagen``): no import of the repository
depends on which of ``system/`` and ``dataset/`` comes first on ``sys.path``.

Once both folders held a top-level package named ``utils`` and the generators worked
only because they put ``dataset/`` in front. These tests fail if a second top-level ``utils``
(or ``datagen``) appears, if a generator or a ``datagen`` module imports a name that the
simulator's folder also provides, or if a test imports the helpers under a second name.
"""

import ast
import os
from importlib.machinery import PathFinder
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM, DATASET = REPO / "system", REPO / "dataset"
GENERATORS = sorted(DATASET.glob("*.py"))
DATAGEN_MODULES = sorted((DATASET / "datagen").glob("*.py"))


def _module_names(folder: Path, name: str) -> list[str]:
    """Every ``name`` package (a folder holding .py files) or ``name.py`` module under ``folder``,
    relative to it; skips hidden folders, caches, results and generated dataset folders."""
    found = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        if f"{name}.py" in files:
            found.append((here / f"{name}.py").relative_to(folder).as_posix())
        package = here / name
        if name in dirs and any(p.suffix == ".py" for p in package.iterdir()):
            found.append(package.relative_to(folder).as_posix())
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "results")
                   and (here != DATASET or d == "datagen")]
    return sorted(found)


def _imports(path: Path) -> set[str]:
    """Dotted names of the absolute imports of a file, module level and inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _origin(name: str, path: list[Path]) -> str | None:
    spec = PathFinder.find_spec(name, [str(p) for p in path])
    if spec is None:
        return None
    return spec.origin or str(list(spec.submodule_search_locations or []))


def test_only_system_has_a_utils_package_and_only_dataset_a_datagen_package():
    assert _module_names(REPO, "utils") == ["system/utils"]
    assert _module_names(REPO, "datagen") == ["dataset/datagen"]


def test_helpers_found():
    # guards the parametrised tests below against an empty glob
    assert len(GENERATORS) >= 20 and "convert_pfllib.py" in {p.name for p in GENERATORS}
    assert {"dataset_utils.py", "lock.py", "partition.py"} <= {p.name for p in DATAGEN_MODULES}


@pytest.mark.parametrize("path", GENERATORS + DATAGEN_MODULES, ids=lambda p: p.name)
def test_generator_imports_never_resolve_against_system(path):
    names = {name.split(".")[0] for name in _imports(path)}
    assert "utils" not in names
    for name in sorted(names):
        # the same module whichever folder comes first, and never one of the simulator's
        assert _origin(name, [DATASET, SYSTEM]) == _origin(name, [SYSTEM, DATASET]), name
        assert _origin(name, [SYSTEM]) is None, f"{path.name} imports {name} from system/"
    if path.parent == DATASET:
        assert "datagen" in names
        assert _origin("datagen", [SYSTEM, DATASET]) == str(DATASET / "datagen" / "__init__.py")


def test_tests_import_the_helpers_under_one_name():
    """``dataset.datagen`` would load a second copy of each module (two ``DatasetError``
    classes, two lock modules) beside the ``datagen`` that the scripts use."""
    offenders = [f"{p.relative_to(REPO)}: {name}" for p in sorted((REPO / "tests").rglob("*.py"))
                 for name in _imports(p) if name.split(".")[:2] in (["dataset", "datagen"],
                                                                           ["dataset", "utils"])]
    assert offenders == []

