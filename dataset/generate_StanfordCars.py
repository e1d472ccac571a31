"""Generate federated StanfordCars (196 car models), from the Kaggle copy (``--raw-dir``).

Run from ``dataset/``: ``python generate_StanfordCars.py noniid - dir --raw-dir stanford_cars``;
images resized to ``--image-size`` (default 64); ``--splits train test`` adds the test set.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # our utils/, never system/utils

from utils.dataset_utils import main  # noqa: E402
from utils.errors import DatasetError  # noqa: E402
from utils.misc_sources import CARS_RAW_HELP, CARS_SPLITS, cars_loader  # noqa: E402


def add_arguments(parser):
    parser.add_argument("--image-size", type=int, default=64,
                        help="images are resized to SIZE x SIZE (default 64)")
    parser.add_argument("--splits", nargs="+", choices=list(CARS_SPLITS), default=["train"],
                        help="official splits, the first as training set (default train, PFLlib's)")


def bind(args):
    if not 4 <= args.image_size <= 512:
        raise DatasetError(f"--image-size must be between 4 and 512, got {args.image_size}")
    splits = tuple(dict.fromkeys(args.splits))
    return cars_loader(splits, args.image_size), 196, {"image_size": args.image_size,
                                                       "splits": list(splits)}


if __name__ == "__main__":
    sys.exit(main(None, "StanfordCars", None, HERE, raw_dir_help=CARS_RAW_HELP,
                  add_arguments=add_arguments, bind=bind))
