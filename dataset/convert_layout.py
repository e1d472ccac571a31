"""Convert a generated dataset between the npz layout (PFLlib's ``train/<i>.npz``) and the packed one.

``python convert_layout.py MNIST --to packed --out-dir MNIST_packed`` writes a packed copy
(``datagen/layout.py``: one memory-mapped file per split and array, and the clients' offsets);
``--to npz`` writes per-client npz files back. The arrays are copied bit for bit, so a run on
either folder gives the same numbers. ``python convert_layout.py FOLDER --check`` reads and
checks every client of a folder of either layout (labels, NaN, sizes) and writes nothing.
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.errors import DatasetError  # noqa: E402
from datagen.relayout import check_folder, convert_layout  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the converter."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="dataset folder (config.json, train/, test/)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--to", choices=("npz", "packed"), help="the layout to write")
    action.add_argument("--check", action="store_true", help="read and check every client; write nothing")
    # a str, not a Path: Path("") is ".", and an empty --out-dir (an unset variable) must be refused
    parser.add_argument("--out-dir", default=None, help="folder to write (new, or converted before)")
    parser.add_argument("--force", action="store_true", help="overwrite a dataset in --out-dir")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the converter; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.check:
            config = check_folder(args.source)
            print(f"{args.source}: {config['num_clients']} clients ({config['format']}) read and checked")
            return 0
        if args.out_dir is None:
            raise DatasetError("--to needs --out-dir: the folder to write")
        config = convert_layout(args.source, args.out_dir, args.to, force=args.force)
    except DatasetError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir} ({config['format']}, {config['num_clients']} clients)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
