#!/usr/bin/env bash
# Set up the project in .venv/ (idempotent: a few seconds when nothing changed), then optionally
#   --demo  run a complete federated experiment on data that needs no download
#   --test  run the whole test suite
#   --ray   also install the Ray engine's pinned extra (requirements-ray.txt); combine: --ray --test
# Usage: ./prepare.sh [--ray] [--demo | --test] [extra pytest args after --test]
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: Python 3.11 or newer is needed (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "prepare: creating $VENV"
    "$PY" -m venv "$VENV"
fi
# Reinstall only when requirements.txt changed since the last successful install.
STAMP="$VENV/.requirements.sha256"
WANT=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "prepare: installing pinned dependencies (requirements.txt)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
    echo "$WANT" > "$STAMP"
fi
"$VENV/bin/python" -c 'import torch, numpy, h5py, sklearn, matplotlib, tqdm, safetensors' || {
    echo "error: the environment in .venv is broken; remove .venv and run ./prepare.sh again" >&2; exit 2; }

# --ray: the optional Ray engine (--engine ray), pinned in requirements-ray.txt, installed once
if [ "${1:-}" = "--ray" ]; then
    shift
    RAY_STAMP="$VENV/.requirements-ray.sha256"
    RAY_WANT=$(cat requirements.txt requirements-ray.txt | sha256sum | cut -d' ' -f1)
    if [ ! -f "$RAY_STAMP" ] || [ "$(cat "$RAY_STAMP")" != "$RAY_WANT" ]; then
        echo "prepare: installing the Ray extra (requirements-ray.txt)"
        # requirements.txt again as constraints, so no pin of it (torch) can move
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-ray.txt -c requirements.txt
        echo "$RAY_WANT" > "$RAY_STAMP"
    fi
    "$VENV/bin/python" -c 'import ray' || { echo "error: ray does not import in .venv; run ./prepare.sh --ray again" >&2; exit 2; }
fi

case "${1:-}" in
    --demo)
        shift
        cd "$ROOT/dataset"
        "$VENV/bin/python" generate_Digits.py noniid - dir --num-clients 10 --alpha 0.5
        cd "$ROOT/system"
        exec "$VENV/bin/python" main.py -data Digits -m DNN -algo FedAvg -gr 30 -lbs 10 -lr 0.05 -dev cpu -go demo --overwrite "$@"
        ;;
    --test)
        shift
        cd "$ROOT"
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    "") echo "prepare: ready (.venv). Next: ./prepare.sh --demo or ./prepare.sh --test" ;;
    *) echo "error: unknown option $1 (use --ray, --demo or --test)" >&2; exit 2 ;;
esac
