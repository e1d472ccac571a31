"""Convert a PFLlib-generated dataset folder into the pickle-free ``npz-xy-v1`` format.

``python convert_pfllib.py PFLlib/dataset/MNIST --out-dir MNIST --trust-pickle`` writes a
converted copy; ``--in-place`` instead replaces the PFLlib files in the source folder.

PFLlib stores every client file as a pickled dict, so reading one can execute
code from it: the conversion runs only with ``--trust-pickle``. Clients are
converted under their own ids; a folder holding only some clients (a sample) is
converted as far as it goes and ``config.json`` lists the ids in
``clients_present``. PFLlib's config.json is copied with our keys added where
they can be inferred (``format``, ``input_shape``, per-client sample counts);
label counts are checked against PFLlib's "Size of samples for labels in
clients".
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.convert import convert_pfllib_folder  # noqa: E402
from datagen.errors import DatasetError  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the converter."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="PFLlib dataset folder (config.json, train/, test/)")
    target = parser.add_mutually_exclusive_group()
    # a str, not a Path: Path("") is ".", and an empty --out-dir (an unset variable) must be refused
    target.add_argument("--out-dir", default=None, help="folder to write (new, or converted before)")
    target.add_argument("--in-place", action="store_true",
                        help="replace the PFLlib files in the source folder (they are lost)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow unpickling the source files (can execute code from them)")
    parser.add_argument("--name", default=None, help="dataset name stored in config.json")
    parser.add_argument("--force", action="store_true", help="overwrite a converted folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the converter; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        config = convert_pfllib_folder(args.source, args.out_dir, trust_pickle=args.trust_pickle,
                                       in_place=args.in_place, name=args.name, force=args.force)
    except DatasetError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(json.dumps({k: config.get(k) for k in ("clients_present", "input_shape", "format")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
