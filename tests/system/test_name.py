"""The platform calls itself FedCohort: README, conda environment and ``main.py -h``; the old name is gone.

FL-bench is an established peer (KarhouTam's); a line that names that repository may mention it.
"""
from __future__ import annotations

import re
from pathlib import Path
import shutil
import subprocess

import pytest

import main
from conftest import REPO

# Written as a pattern so that this file does not contain the name it looks for.
OLD_NAME = re.compile(r"fl[-_]bench", re.IGNORECASE)
PEER_OWNER = "karhoutam"


def tracked_text_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if listing.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: the tracked files cannot be listed")
    return [name for name in listing.stdout.decode().split("\0") if name]


def text_lines(path: Path) -> list[str]:
    """The lines of a tracked text file; none for a binary one or one deleted in the working tree (not yet
    committed)."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    if b"\0" in raw:  # binary
        return []
    return raw.decode("utf-8", errors="replace").splitlines()


def test_no_tracked_file_uses_the_old_name():
    offenders = []
    for name in tracked_text_files():
        for number, line in enumerate(text_lines(REPO / name), 1):
            if OLD_NAME.search(line) and PEER_OWNER not in line.lower():
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "the old platform name is still used:\n" + "\n".join(offenders)


def test_readme_and_conda_environment_name_fedcohort():
    readme = (REPO / "README.md").read_text().splitlines()
    assert "FedCohort" in readme[0]
    assert any("PFLlib-compatible" in line for line in readme[:5])
    env = (REPO / "env_cuda_latest.yaml").read_text()
    assert re.search(r"^name: fedcohort$", env, re.MULTILINE)
    assert "conda activate fedcohort" in env


def test_conda_environment_pins_what_requirements_txt_pins():
    # a GPU user's conda environment lacking a pinned package failed late: without safetensors a whole run
    # ended in an error when its model was written (main.py now refuses that at the start as well)
    env = (REPO / "env_cuda_latest.yaml").read_text().splitlines()
    conda_pins = sorted(line.strip()[2:] for line in env if re.fullmatch(r"\s+- [A-Za-z0-9_.-]+==\S+", line))
    wanted = sorted(line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()
                    if line.strip() and not line.lstrip().startswith("#"))
    assert conda_pins == wanted


def test_main_help_names_fedcohort(capsys):
    with pytest.raises(SystemExit) as stop:
        main.main(["-h"])
    assert stop.value.code == 0
    assert "FedCohort" in capsys.readouterr().out
