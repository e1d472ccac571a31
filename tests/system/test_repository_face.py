"""The repository speaks of the product alone: no references to its own tracker (the word for a
tracker entry followed by its number), no words about who did the work or in which sitting of the
work (the patterns below, with planted examples), no calendar dates, and no command a user is shown
that points outside the repository (the shared folder beside a checkout, the machine's work folder).

Other projects' trackers cited as sources stay allowed when the project is named right before the
number: "PFLlib #223", "pytorch#35600", "FedALA #18".
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO
from test_name import text_lines, tracked_text_files

#: projects whose trackers the repository cites as sources (their name comes right before the number)
#: (the second is KarhouTam's benchmark, spelt in pieces as test_name.py asks)
CITED_PROJECTS = ("PFLlib", "FL-" + "bench", "FedALA", "Flower", "PyTorch", "torch", "Ray", "NumPy", "h5py")
CITED = re.compile(r"(?:" + "|".join(re.escape(name) for name in CITED_PROJECTS) + r")(?:'s)?\s*$", re.IGNORECASE)

#: our own tracker: the word, in the singular or plural, an optional '#' and a number (see PLANTED)
TRACKER = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)

#: how the work was organised: who did it, in which sitting
ORGANISATION = re.compile(
    r"\bsessions?\b"
    r"|\b(?:the|next|our|a|another|previous) lead\b"
    r"|\bhelpers? (?-i:[A-Z])\b(?!\w)"
    r"|\b(?:other|another|two|three|four|five|each|no|any|by) helpers?\b(?! (?:function|of|for|in|that|which)\b)"
    r"|\bhelpers? (?:ran|measured|found|report|reported)\b"
    r"|\b(?:this|that|a|one|next|last|previous|each|same|earlier) sitting\b",
    re.IGNORECASE)

#: a calendar date or time of day (a measurement's date belongs in git, not in the text)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b\d\d:\d\d UTC\b")

#: a path outside the repository
OUTSIDE = re.compile(r"\.\./shared\b|\.\./\.\./shared\b|(?<![\w.])/work/")


def tracker_hits(line: str) -> list[str]:
    """Our own tracker numbers in ``line`` (a cited project's are skipped)."""
    return [match.group(0) for match in TRACKER.finditer(line) if not CITED.search(line[:match.start()])]


def organisation_hits(line: str) -> list[str]:
    return [match.group(0) for match in ORGANISATION.finditer(line)]


def date_hits(line: str) -> list[str]:
    return [match.group(0) for match in DATE.finditer(line)]


def outside_hits(line: str) -> list[str]:
    return [match.group(0) for match in OUTSIDE.finditer(line)]


def offenders(root: Path, names: list[str], find) -> list[str]:
    """``file:line: hit`` for every hit of ``find`` in the text files ``names`` under ``root``, and for
    every hit in the file names themselves."""
    found = []
    for name in names:
        found += [f"{name}: file name: {hit}" for hit in find(name.replace("_", " "))]
        for number, line in enumerate(text_lines(root / name), 1):
            found += [f"{name}:{number}: {hit}: {line.strip()[:160]}" for hit in find(line)]
    return found


def user_facing(names: list[str]) -> list[str]:
    """What a user reads or runs: the READMEs, docs/ and experiments/."""
    return [name for name in names
            if name.endswith("README.md") or name.startswith(("docs/", "experiments/"))]


# Built up from pieces so that this file does not hold what it looks for.
PLANTED = {
    tracker_hits: ["as " + "issue" + " 28 asked", "(" + "Issue" + " #5)", "issues" + " 24 and 25",
                   "experiments/" + "issue" + "28_gpu.sh"],
    organisation_hits: ["the " + "lead" + " merges", "another " + "helper" + " measured", "this " + "sess" + "ion",
                        "helper" + " C's table", "last " + "sitting"],
    date_hits: ["measured 20" + "26-11-27", "at 15:00" + " UTC"],
    outside_hits: ["--raw-dir ../.." + "/shared/data/MNIST/raw", "cd " + "/work" + "/main"],
}
ALLOWED = {
    # other projects' tracker numbers cited as sources (spelled in pieces: this file names none itself)
    tracker_hits: ["PFLlib #" + "223", "PFLlib issues #" + "120, #130", "pytorch#" + "35600", "PFLlib issue " + "223",
                   "FedALA #" + "18"],
    organisation_hits: ["the generators' helpers", "Helpers of the tests", "clients sitting out a round",
                        "SITTING", "Sageflow leads early", "FedACS leads only where", "a helper function"],
    date_hits: ["Li et al., ICDE 2022", "torch 2.4.0"],
    outside_hits: ["--raw-dir dataset/MNIST/raw", "experiments/out/work/", "results/"],
}


@pytest.mark.parametrize("find", list(PLANTED), ids=lambda find: find.__name__)
def test_each_pattern_finds_a_planted_hit_and_spares_legitimate_words(tmp_path, find):
    planted = tmp_path / "planted.md"
    planted.write_text("\n".join(PLANTED[find] + ALLOWED[find]) + "\n")
    found = offenders(tmp_path, ["planted.md"], find)
    assert len(found) == len(PLANTED[find]), found
    assert all(f"planted.md:{number}:" in hit for number, hit in enumerate(found, 1)), found


def test_a_planted_file_name_is_found(tmp_path):
    assert offenders(tmp_path, ["experiments/" + "issue" + "24_device.py"], tracker_hits)


def test_no_tracker_numbers_anywhere():
    found = offenders(REPO, tracked_text_files(), tracker_hits)
    assert not found, "tracker numbers (say what the text means instead):\n" + "\n".join(found)


def test_no_words_about_who_did_the_work():
    found = offenders(REPO, tracked_text_files(), organisation_hits)
    assert not found, "words about how the work was organised:\n" + "\n".join(found)


def test_no_calendar_dates():
    found = offenders(REPO, tracked_text_files(), date_hits)
    assert not found, "dates (git keeps when; results pages say on which machine):\n" + "\n".join(found)


def test_no_user_facing_path_outside_the_repository():
    found = offenders(REPO, user_facing(tracked_text_files()), outside_hits)
    assert not found, "paths outside the repository in what a user reads or runs:\n" + "\n".join(found)
