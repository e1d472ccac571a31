"""``ledger.py verify`` on model files it cannot read: a corrupt or truncated ``.safetensors`` (beside
the ledger or given by ``--model``), and a ``--model`` that is missing or a folder, are one
``error:`` line and exit status 2 (an input to fix, not a failed check), and leave every file as it
was. The ledger is built here with the module's own sealing (two nodes, one round)."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

import ledger


def write_run(folder):
    """A valid ledger and its model, ``run.ledger`` and ``run.safetensors``; returns the ledger."""
    tensors = {"body.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
               "head.bias": np.array([0.5, -1.0], dtype=np.float32)}
    flat = np.concatenate([tensors[name].reshape(-1) for name in ("body.weight", "head.bias")])
    final = ledger.sha256_hex(flat.tobytes())
    lines: list[str] = []
    ledger.append_block(lines, {"kind": "genesis", "format": ledger.FORMAT, "version": ledger.VERSION,
                                "nodes": 2, "quorum": 2, "layout": [["body.weight", 6], ["head.bias", 2]]})
    ledger.append_block(lines, {"kind": "round", "proposals": [final, final], "model_sha256": final,
                                "agreeing": [0, 1], "outvoted": []})
    path = folder / "run.ledger"
    path.write_bytes(ledger.ledger_bytes(lines))
    save_file(tensors, str(folder / "run.safetensors"))
    return path


def files_of(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def one_error(capsys, argv, *needles):
    """Exit status 2, nothing on stdout, one ``error:`` line holding every needle."""
    code = ledger.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_the_intact_run_verifies_with_its_model(tmp_path, capsys):
    path = write_run(tmp_path)
    assert ledger.main(["verify", str(path)]) == 0
    assert "the last committed model matches run.safetensors" in capsys.readouterr().out
    assert ledger.main(["verify", str(path), "--model", str(tmp_path / "run.safetensors")]) == 0


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "empty"])
@pytest.mark.parametrize("given", [False, True], ids=["beside", "--model"])
def test_an_unreadable_model_is_one_line_exit_2(tmp_path, capsys, damage, given):
    path = write_run(tmp_path)
    model = tmp_path / "run.safetensors"
    data = model.read_bytes()
    model.write_bytes({"truncated": data[:-5], "corrupt": b"\xff" * 8 + data[8:], "empty": b""}[damage])
    before = files_of(tmp_path)
    one_error(capsys, ["verify", str(path), *(["--model", str(model)] if given else [])],
              f"{model} is not an intact safetensors model (corrupt or truncated", "--model")
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("what,needle", [("missing", "does not exist; pass the run's model file"),
                                         ("folder", "is a folder; pass the run's model file")])
def test_a_model_flag_naming_no_file_is_one_line_exit_2(tmp_path, capsys, what, needle):
    """Formerly 'ledger OK' with the model check skipped."""
    path = write_run(tmp_path)
    model = tmp_path / ("nothing.safetensors" if what == "missing" else "models")
    if what == "folder":
        model.mkdir()
    before = files_of(tmp_path)
    one_error(capsys, ["verify", str(path), "--model", str(model)], f"--model {model} {needle}")
    assert files_of(tmp_path) == before


def test_no_model_beside_the_ledger_checks_the_chain_alone(tmp_path, capsys):
    path = write_run(tmp_path)
    (tmp_path / "run.safetensors").unlink()
    assert ledger.main(["verify", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ledger OK: 2 blocks (1 rounds)") and "model matches" not in out
