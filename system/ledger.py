"""FLChain's ledger: an append-only, hash-linked chain of blocks, and its verifier.

``python ledger.py verify results/<run>.ledger`` re-checks a ledger that ``-algo FLChain`` wrote
beside its results; it prints one line and exits 0 when every check passes, 1 when one fails
(the first failure is named, with its line), 2 when a file cannot be read (the ledger, or the model:
missing, a folder, or not an intact safetensors file).

File format (text, one block a line)::

    <sha256 of BODY, 64 lowercase hex digits> <BODY>\\n

``BODY`` is the block as canonical JSON (keys sorted, no spaces, ASCII only). Every block holds
``height`` (its line number from 0) and ``prev`` (the hash of the line before; 64 zeros for the
genesis block). The hash covers the exact bytes of the body, and the next block names it, so
changing any byte of any line breaks that line's own hash or the link after it: a one-byte change
anywhere is caught. Cutting whole blocks off the end leaves a valid shorter chain; the last
block's model hash is then checked against the saved model when there is one (below).

Blocks (written by ``flcore/servers/serverflchain.py``):

* genesis: the channel (one per global model), the devices registered to it, the edge nodes, the
  quorum, the malicious nodes, the flat model's layout (tensor names and sizes, in the order of the
  flat vector) and the sha256 of the initial model's bytes;
* one block per training round: the round's transactions (client, samples, sha256 of the uploaded
  model), every edge node's proposed aggregate hash, the committed hash, the nodes that agreed and
  those outvoted, and the block's times on the virtual clock.

What ``verify`` checks, block by block: the line's hash, the link to the previous block, the
height, that the body is canonical JSON, and the consensus (the committed hash was proposed by at
least ``quorum`` nodes, which are exactly the ``agreeing`` ones; the others are ``outvoted``). With
the run's model beside the ledger (``<run>.safetensors``, main.py's ``--save_model``) or given by
``--model``, the last committed hash must be the sha256 of that model's flat bytes, rebuilt from
the genesis layout. Every model hash is the sha256 of the float32 flat vector's bytes
(little-endian, as ``numpy.ndarray.tobytes`` writes them on every platform torch supports).

This module imports neither torch nor the federated layers, so verification is light.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Iterable

FORMAT = "fedcohort-ledger"
VERSION = 1
GENESIS_PREV = "0" * 64


class LedgerError(Exception):
    """A ledger that fails a check; the message is the one line the verifier prints."""


class UnreadableModel(Exception):
    """A model file that cannot be checked (missing, a folder, corrupt or truncated): an input
    error, not a failed check; the message is the one line the verifier prints."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(block: dict[str, Any]) -> str:
    """The one JSON text of a block that is hashed and written."""
    return json.dumps(block, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def seal(block: dict[str, Any]) -> tuple[str, str]:
    """(hash, line without its newline) of ``block``."""
    body = canonical(block)
    digest = sha256_hex(body.encode("ascii"))
    return digest, f"{digest} {body}"


def head_hash(lines: list[str]) -> str:
    """The hash the next block links to: the last line's, or the genesis' zeros."""
    return lines[-1].split(" ", 1)[0] if lines else GENESIS_PREV


def append_block(lines: list[str], block: dict[str, Any]) -> str:
    """Link ``block`` to the chain ``lines`` (its ``height`` and ``prev`` are set here), append its
    line and return its hash."""
    block = {**block, "height": len(lines), "prev": head_hash(lines)}
    digest, line = seal(block)
    lines.append(line)
    return digest


def ledger_bytes(lines: Iterable[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("ascii")


def majority(nodes: int) -> int:
    """The smallest quorum two disagreeing groups cannot both reach: ⌊M/2⌋ + 1."""
    return nodes // 2 + 1


def decide(proposals: list[str], quorum: int) -> tuple[str | None, list[int], list[int]]:
    """The hash proposed by at least ``quorum`` nodes (None when none is), the nodes that proposed
    it and the others, in node order."""
    for candidate in dict.fromkeys(proposals):
        agreeing = [node for node, proposal in enumerate(proposals) if proposal == candidate]
        if len(agreeing) >= quorum:
            return candidate, agreeing, [node for node in range(len(proposals)) if node not in agreeing]
    return None, [], list(range(len(proposals)))


# -------------------------------------------------------------------------------- verification
def read_blocks(data: bytes) -> list[dict[str, Any]]:
    """Every block of a ledger's bytes after the per-line checks (hash, link, height, canonical
    form); raises :class:`LedgerError` naming the first line that fails."""
    if not data:
        raise LedgerError("the ledger is empty (no genesis block)")
    if not data.endswith(b"\n"):
        raise LedgerError("the ledger does not end with a newline (the last block is cut or altered)")
    blocks = []
    previous = GENESIS_PREV
    for number, raw in enumerate(data[:-1].split(b"\n"), start=1):
        digest, sep, body = raw.partition(b" ")
        if not sep or len(digest) != 64:
            raise LedgerError(f"line {number}: not '<sha256> <block>' (the line was altered)")
        if sha256_hex(body) != digest.decode("ascii", "replace"):
            raise LedgerError(f"line {number}: the block's sha256 does not match its contents (the block was altered)")
        try:
            block = json.loads(body.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise LedgerError(f"line {number}: the block is not JSON") from None
        if not isinstance(block, dict) or canonical(block).encode("ascii") != body:
            raise LedgerError(f"line {number}: the block is not in canonical form")
        if block.get("prev") != previous:
            raise LedgerError(f"line {number}: the block does not link to the block before it (prev hash differs)")
        if block.get("height") != number - 1:
            raise LedgerError(f"line {number}: height {block.get('height')!r}, expected {number - 1}")
        previous = digest.decode("ascii")
        blocks.append(block)
    return blocks


def check_consensus(blocks: list[dict[str, Any]]) -> None:
    """The genesis block's settings, and in every round block a committed hash that a quorum of the
    registered nodes proposed (and exactly the agreeing/outvoted split that follows)."""
    genesis = blocks[0]
    if genesis.get("kind") != "genesis" or genesis.get("format") != FORMAT:
        raise LedgerError("line 1: not a FLChain genesis block")
    if genesis.get("version") != VERSION:
        raise LedgerError(f"line 1: ledger version {genesis.get('version')!r}, this verifier reads {VERSION}")
    nodes, quorum = genesis["nodes"], genesis["quorum"]
    for number, block in enumerate(blocks[1:], start=2):
        if block.get("kind") != "round":
            raise LedgerError(f"line {number}: a block of kind {block.get('kind')!r} after the genesis block")
        proposals = block["proposals"]
        if len(proposals) != nodes:
            raise LedgerError(f"line {number}: {len(proposals)} proposals from {nodes} registered edge nodes")
        committed, agreeing, outvoted = decide(proposals, quorum)
        if committed is None or committed != block["model_sha256"]:
            raise LedgerError(f"line {number}: the committed model hash was not proposed by a quorum of {quorum} nodes")
        if agreeing != block["agreeing"] or outvoted != block["outvoted"]:
            raise LedgerError(f"line {number}: the agreeing/outvoted nodes do not match the proposals")


def flat_model_sha256(model_path: Path, layout: list[list]) -> str:
    """sha256 of the flat float32 vector rebuilt from a saved state dict (safetensors) in the
    genesis block's tensor order."""
    import numpy as np
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(model_path))
    except SafetensorError as exc:
        raise UnreadableModel(f"{model_path} is not an intact safetensors model (corrupt or truncated: "
                              f"{exc}); restore the run's model or pass it with --model") from None
    parts = []
    for name, numel in layout:
        if name not in tensors:
            raise LedgerError(f"{model_path}: has no tensor {name!r} of the ledger's model layout")
        array = np.ascontiguousarray(tensors[name], dtype="<f4").reshape(-1)
        if array.size != numel:
            raise LedgerError(f"{model_path}: tensor {name!r} has {array.size} values, the ledger's layout {numel}")
        parts.append(array)
    return sha256_hex(np.concatenate(parts).tobytes() if parts else b"")


def model_to_check(ledger: Path, model: Path | None) -> Path | None:
    """The model file to check: ``model`` (the user's ``--model``, which must be a file), else the
    ledger's ``<run>.safetensors`` when there is one (None: no model check)."""
    if model is None:
        beside = ledger.with_suffix(".safetensors")
        return beside if beside.is_file() else None
    if model.is_dir():
        raise UnreadableModel(f"--model {model} is a folder; pass the run's model file (<run>.safetensors)")
    if not model.exists():
        raise UnreadableModel(f"--model {model} does not exist; pass the run's model file (<run>.safetensors, "
                              f"which main.py's --save_model writes beside the ledger)")
    return model


def verify(path: Path, model: Path | None = None) -> str:
    """Every check of the module docstring; returns the one line printed on success."""
    model = model_to_check(path, model)
    blocks = read_blocks(path.read_bytes())
    try:
        check_consensus(blocks)
    except (KeyError, TypeError, AttributeError) as exc:  # a sealed block that lacks a field
        raise LedgerError(f"a block lacks or garbles the field {exc}") from None
    checked = ""
    if model is not None:
        final = blocks[-1]["model_sha256"]
        if flat_model_sha256(model, blocks[0]["layout"]) != final:
            raise LedgerError(f"the last committed model hash does not match the model in {model}")
        checked = f"; the last committed model matches {model.name}"
    outvoted = sum(len(b["outvoted"]) for b in blocks[1:])
    return (f"ledger OK: {len(blocks)} blocks ({len(blocks) - 1} rounds), every link and consensus verified, "
            f"{outvoted} proposal(s) outvoted{checked}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledger.py", description="Verify an FLChain ledger (results/<run>.ledger).")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="re-verify every block's hash, link and consensus, and the final model")
    check.add_argument("ledger", type=Path)
    check.add_argument("--model", type=Path, default=None,
                       help="the run's saved model (default: <ledger>.safetensors when it exists)")
    args = parser.parse_args(argv)
    try:
        print(verify(args.ledger, args.model))
    except LedgerError as exc:
        print(f"ledger FAILED: {args.ledger}: {exc}", file=sys.stderr)
        return 1
    except UnreadableModel as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot read {exc.filename or args.ledger}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
