"""The repository is clean under its linter (``pyproject.toml``'s ``[tool.ruff]``), and the protocol's
types are imported from their one home, ``flcore.protocol``."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def ruff_command() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed (pip install -r requirements.txt)")


def test_the_linter_is_clean():
    out = subprocess.run([*ruff_command(), "check", "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_linter_fails_on_an_unused_import(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n")
    out = subprocess.run([*ruff_command(), "check", "--no-cache", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1 and "F401" in out.stdout


PROTOCOL_TYPES = {"ClientUpdate", "LocalJob", "RoundPackage", "Task", "Runtime", "RoundResult", "SentOnce", "with_private_part"}


def test_protocol_types_come_from_the_protocol_module_only():
    offenders = []
    for path in [*(REPO / "system").rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "experiments").rglob("*.py")]:
        for match in re.finditer(r"^\s*from flcore\.(?!protocol\b)[\w.]+ import \(?([^)\n]+)", path.read_text(), re.M):
            names = {n.strip().split(" as ")[0] for n in match.group(1).split("#")[0].split(",")}
            if names & PROTOCOL_TYPES:
                offenders.append(f"{path.relative_to(REPO)}: {match.group(0).strip()}")
    assert not offenders, offenders
