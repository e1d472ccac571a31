"""--malloc_keep_freed (utils/allocator.py): the flag, its refusal, and what glibc does with it,
seen from a child process's page faults (the setting lasts for a process, so never in this one)."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

import main
from utils import allocator

SYSTEM = Path(__file__).resolve().parents[2] / "system"

#: a child that frees a 64 MiB block (over glibc's largest dynamic mmap threshold, 32 MiB) and
#: prints the page faults of filling a new one; ctypes only, no torch: it starts in a blink
CHILD = r"""
import ctypes, resource, sys
sys.path.insert(0, sys.argv[1])
from utils.allocator import keep_freed_memory
applied = keep_freed_memory(sys.argv[2])
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 * 1024**2

def faults_of_a_new_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults_of_a_new_block()  # the first block is fresh memory either way
print(int(applied), min(faults_of_a_new_block() for _ in range(3)))
"""


def child_faults(mode: str) -> tuple[bool, int]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(SYSTEM), mode], capture_output=True, text=True,
                          check=True, timeout=60)
    applied, faults = done.stdout.split()
    return applied == "1", int(faults)


def test_the_flag_parses_with_on_as_default():
    assert main.parse_args([]).malloc_keep_freed == "on"
    assert main.parse_args(["--malloc_keep_freed", "off"]).malloc_keep_freed == "off"
    assert main.parse_args(["--malloc-keep-freed=on"]).malloc_keep_freed == "on"


def test_a_bad_value_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main.parse_args(["--malloc_keep_freed", "sometimes"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and "--malloc_keep_freed" in err
    with pytest.raises(ValueError, match="malloc_keep_freed"):
        allocator.keep_freed_memory("sometimes")


@pytest.mark.skipif(allocator.glibc_version() is None, reason="glibc only: other C libraries are left alone")
def test_on_glibc_a_freed_block_is_reused_without_page_faults():
    pages = 64 * 1024**2 // 4096
    applied, faults = child_faults("on")
    assert applied and faults < pages // 20, faults  # the block came back from the heap, already mapped
    applied, faults = child_faults("off")
    assert not applied and faults > pages // 2, faults  # glibc's default: unmapped when freed, faulted in again


def test_elsewhere_nothing_is_called_and_one_debug_line_says_so(caplog):
    with mock.patch.object(allocator, "glibc_version", return_value=None), \
            mock.patch.object(allocator.ctypes, "CDLL", side_effect=AssertionError("mallopt called")), \
            caplog.at_level(logging.DEBUG, logger="fl"):
        assert allocator.keep_freed_memory("on") is False
    assert len(caplog.records) == 1 and "not glibc" in caplog.records[0].getMessage()


def test_off_never_touches_the_allocator():
    with mock.patch.object(allocator.ctypes, "CDLL", side_effect=AssertionError("mallopt called")):
        assert allocator.keep_freed_memory("off") is False


def test_main_applies_the_flag_before_loading_data(tmp_path):
    """main.py hands the flag's value to keep_freed_memory once per run (through runner/device.py's
    configure_backends), before the dataset is read (the run stops at the missing dataset right after)."""
    import runner.device

    calls = []
    with mock.patch.object(runner.device, "keep_freed_memory", side_effect=calls.append):
        code = main.main(["-data", str(tmp_path / "none"), "--malloc_keep_freed", "off", "--progress", "False",
                          "--results_dir", str(tmp_path)])
    assert code == 2 and calls == ["off"]


def test_benchmark_variants_pass_the_flag():
    """``benchmark.py --engines sequential+keepfreed sequential+returnfreed`` compares both in one command
    (each (configuration, engine) runs in its own process, so each gets its own setting)."""
    import benchmark

    assert benchmark.split_variant("sequential+keepfreed") == ("sequential", ["--malloc_keep_freed", "on"])
    assert benchmark.split_variant("threaded+returnfreed") == ("threaded", ["--malloc_keep_freed", "off"])
