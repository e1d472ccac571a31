"""Generate federated StanfordCars (196 car models), from the Kaggle copy (``--raw-dir``).

Run from ``dataset/``: ``python generate_StanfordCars.py noniid - dir --raw-dir stanford_cars``;
images resized to ``--image-size`` (default 64); ``--splits train test`` adds the test set.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.image_folders import add_image_size_argument, check_image_size  # noqa: E402
from datagen.misc_sources import CARS_RAW_HELP, CARS_SPLITS, cars_loader  # noqa: E402


def add_arguments(parser):
    add_image_size_argument(parser, 64)
    parser.add_argument("--splits", nargs="+", choices=list(CARS_SPLITS), default=["train"],
                        help="official splits, the first as training set (default train, PFLlib's)")


def bind(args):
    check_image_size(args.image_size)
    splits = tuple(dict.fromkeys(args.splits))
    return cars_loader(splits, args.image_size), 196, {"image_size": args.image_size,
                                                       "splits": list(splits)}


if __name__ == "__main__":
    sys.exit(main(None, "StanfordCars", None, HERE, raw_dir_help=CARS_RAW_HELP,
                  add_arguments=add_arguments, bind=bind))
