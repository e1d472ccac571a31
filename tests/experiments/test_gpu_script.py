"""experiments/gpu_speed.sh, the GPU speed tables in one prepared call: it must not rot while no GPU is
at hand. Every benchmark.py call it makes parses, every --engines entry names an engine and variants
that main.py takes, every test file it runs exists and every gpu_step_runners.py kind is one the engine knows (no
GPU and no training here: a failure found on the device costs device time)."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

import benchmark
import main
from conftest import REPO
from flcore.engines.client_conv import BATCHED_CONVS

SCRIPT = REPO / "experiments" / "gpu_speed.sh"


def logical_lines() -> list[str]:
    """The script's lines with backslash continuations joined."""
    return SCRIPT.read_text().replace("\\\n", " ").splitlines()


def benchmark_calls() -> list[list[str]]:
    """The arguments of each benchmark.py run, as the script passes them (its ``bench`` helper adds
    ``--device cuda --warmup 1 --out``); shell variables become plain values, redirections are cut."""
    calls = []
    for line in logical_lines():
        line = line.strip()
        if line.startswith("#") or line.startswith("bench()"):
            continue
        if "benchmark.py" in line and "$PY benchmark.py" in line:
            words = line.split("benchmark.py", 1)[1]
            prefix: list[str] = []
        elif line.startswith("bench "):
            words = " ".join(line.split()[3:])
            prefix = ["--device", "cuda", "--warmup", "1", "--out", "/tmp/x.json"]
        else:
            continue
        words = words.replace('"$OUT/', '"/tmp/gpu-speed/').replace("$PF", "").replace('"$@"', "")
        tokens = shlex.split(words)
        cut = next((i for i, t in enumerate(tokens) if t.startswith(">") or t.startswith("2>")), len(tokens))
        calls.append(prefix + tokens[:cut])
    return calls


def test_the_script_is_valid_bash():
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_every_benchmark_call_parses_and_its_engines_are_what_main_takes():
    calls = benchmark_calls()
    assert len(calls) >= 8  # the main table's four, PART=conv's two and PART=unfold's two
    engines = set()
    for call in calls:
        args = benchmark.parse(call)
        assert args.device == "cuda", call
        engines.update(args.engines)
    assert {"batched+groupednhwc+bf16", "batched+unfold", "sequential"} <= engines
    for entry in sorted(engines):
        engine, flags = benchmark.split_variant(entry)
        parsed = main.parse_args(["-algo", "FedAvg", "-m", "CNN", "--engine", engine, *flags])
        assert getattr(parsed, main.IGNORED_DEST) == [], entry


def test_the_tests_it_runs_exist_and_its_stepbench_kinds_are_known():
    text = "\n".join(logical_lines())
    tests = re.search(r'CUDA_TESTS="([^"]+)"', text).group(1).split()
    tests += re.findall(r"cuda_tests \d+ (\S+\.py)", text)
    for name in tests:
        assert (REPO / name).is_file(), name
    kinds = re.findall(r'"(\w+) \d+ [\d,]+ [01]"', text)  # PART=unfold's "kind clients shape profile" variants
    assert kinds and set(kinds) <= set(BATCHED_CONVS)
    assert (REPO / "experiments" / "gpu_step_runners.py").is_file()
