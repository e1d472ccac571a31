"""``main.py --config FILE.toml``: a run's flags from a TOML file; the command line overrides them."""
from __future__ import annotations

import json
import re

import h5py
import pytest

import main
from toydata import make_dataset
from cli.config_file import expand_config
from utils.errors import FLError


def write(path, text):
    path.write_text(text)
    return str(path)


def parsed(argv):
    return main.parse_args(expand_config(argv, main.build_parser))


def test_file_flags_apply_and_the_command_line_overrides_them(tmp_path):
    config = write(tmp_path / "run.toml", """
[flags]
algo = "FedNova"
lr = 0.01
local_momentum = 0.9
gr = 7
dev = "cpu"
drop_last = false
""")
    args = parsed(["--config", config])
    assert (args.algorithm, args.local_learning_rate, args.local_momentum, args.global_rounds) == ("FedNova", 0.01, 0.9, 7)
    assert args.drop_last is False
    # command-line flags override the file's, before or after --config, in any spelling
    args = parsed(["-lr", "0.05", "--config", config, "--global_rounds", "3", "-algo", "FedAvg"])
    assert (args.algorithm, args.local_learning_rate, args.local_momentum, args.global_rounds) == ("FedAvg", 0.05, 0.9, 3)
    assert parsed([f"--config={config}", "--local-momentum", "0"]).local_momentum == 0.0


def test_without_config_argv_is_unchanged():
    argv = ["-algo", "FedAvg", "-lr", "0.1"]
    assert expand_config(argv, main.build_parser) == argv


@pytest.mark.parametrize("text,message", [
    ("[flags]\nlearning_rat = 0.1\n", "'learning_rat' is not a flag of main.py"),
    ("[flags]\n-lr = 0.1\n", "'-lr' is not a flag of main.py; write flags without their dashes"),
    ("[flags\nlr = 0.1\n", "not valid TOML"),
    ("lr = 0.1\n", "unknown key(s) lr"),
    ("[suite]\ntitle = 'x'\n", "is a suite; run it with python system/suite.py"),
    ("[other]\n", "unknown key(s) other"),
    ("[flags]\ndrop_last = { a = 1 }\n", "drop_last is a table"),
])
def test_bad_files_are_one_line(tmp_path, text, message):
    with pytest.raises(FLError, match=re.escape(message)):
        parsed(["--config", write(tmp_path / "bad.toml", text)])


def test_missing_file_and_value(tmp_path):
    with pytest.raises(FLError, match="no such file"):
        parsed(["--config", str(tmp_path / "absent.toml")])
    with pytest.raises(FLError, match="needs a TOML file"):
        parsed(["--config"])



def test_a_run_from_a_file_stores_the_resolved_flags(tmp_path):
    data = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    config = write(tmp_path / "run.toml", f"""
[flags]
data = "{data}"
m = "DNN"
algo = "FedAvg"
gr = 1
lr = 0.02
dev = "cpu"
results_dir = "{tmp_path / 'res'}"
progress = false
q = true
save_model = false
""")
    assert main.main(expand_config(["--config", config, "-lr", "0.03"], main.build_parser)) == 0
    (path,) = (tmp_path / "res").glob("*.h5")
    with h5py.File(path, "r") as f:
        stored = json.loads(f.attrs["config"])
    assert stored["local_learning_rate"] == 0.03 and stored["model"] == "DNN" and stored["global_rounds"] == 1


def test_main_reads_config_itself_and_the_command_line_overrides(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[flags]\nalgo = "FedProx"\nmu = 0.1\nlr = 0.02\n')
    args = main.parse_args(["--config", str(config), "-lr", "0.03", "-dev", "cpu"])
    assert (args.algorithm, args.mu, args.local_learning_rate) == ("FedProx", 0.1, 0.03)
    assert "--config" in main.build_parser([]).format_help()
