"""Generate federated EMNIST (PFLlib-compatible CLI).

Run from ``dataset/``: ``python generate_EMNIST.py noniid - dir`` downloads NIST's
gzip.zip (MD5-checked) and reads the ``digits`` split, PFLlib's choice, straight
from the zip. ``--split letters|balanced|bymerge|byclass|mnist`` selects the
others (the output folder is then ``EMNIST-<split>``). Offline: ``--raw-dir``
with gzip.zip or the split's four IDX files.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.image_sources import EMNIST_RAW_HELP, EMNIST_SPLITS, emnist_loader  # noqa: E402


def add_arguments(parser):
    parser.add_argument("--split", choices=list(EMNIST_SPLITS), default="digits",
                        help="EMNIST split (default digits, as PFLlib)")


def bind(args):
    if args.out_dir is None and args.split != "digits":
        args.out_dir = HERE / f"EMNIST-{args.split}"
    return emnist_loader(args.split), len(EMNIST_SPLITS[args.split]), {"emnist_split": args.split}


if __name__ == "__main__":
    sys.exit(main(None, "EMNIST", None, HERE, raw_dir_help=EMNIST_RAW_HELP,
                  add_arguments=add_arguments, bind=bind))
