"""experiments/README.md indexes every script in experiments/, names no script that is gone, and
links only to pages and files that exist."""
from __future__ import annotations

import re

from conftest import REPO

EXPERIMENTS = REPO / "experiments"
INDEX = EXPERIMENTS / "README.md"


def scripts() -> set[str]:
    return {path.name for path in EXPERIMENTS.iterdir() if path.suffix in (".py", ".sh")}


def test_every_script_is_in_the_index_with_its_command():
    text = INDEX.read_text()
    missing = sorted(name for name in scripts() if f"`{name}`" not in text)
    assert not missing, f"experiments/README.md does not list {missing}"
    uncommanded = sorted(name for name in scripts() - {"common.py"} if f"experiments/{name}" not in text)
    assert not uncommanded, f"experiments/README.md shows no command for {uncommanded}"


def test_the_index_names_no_missing_script_and_no_broken_link():
    text = INDEX.read_text()
    named = set(re.findall(r"`([\w-]+\.(?:py|sh))`", text))
    assert named - scripts() <= {"benchmark.py", "main.py"}, f"the index names scripts that are gone: {named - scripts()}"
    links = re.findall(r"\]\(([^)#]+)", text)
    assert links
    broken = [link for link in links if not (EXPERIMENTS / link).exists()]
    assert not broken, f"broken links in experiments/README.md: {broken}"


def test_the_results_index_links_every_page_and_every_link_resolves():
    results = REPO / "docs" / "results"
    index = (results / "README.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {path.name for path in results.glob("*.md")} - {"README.md"}
    # suite pages are rendered from result files; the index shows their render commands instead
    suite_pages = {f"{path.stem}.md" for path in (REPO / "suites").glob("*.toml")}
    assert pages - suite_pages <= links, f"docs/results/README.md does not link {sorted(pages - suite_pages - links)}"
    assert all((results / link).exists() for link in links), links
