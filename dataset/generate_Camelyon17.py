"""Generate federated Camelyon17 (tumour patches of 5 hospitals, one client per hospital).

Run from ``dataset/``: ``python generate_Camelyon17.py --raw-dir WILDS_FOLDER``, with the folder
``wilds.get_dataset(..., download=True)`` made (see utils/wilds_sources.py).
Images are resized to ``--image-size`` (default 32).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # our utils/, never system/utils

from utils.dataset_utils import main  # noqa: E402
from utils.errors import DatasetError  # noqa: E402
from utils.wilds_sources import wilds_loader  # noqa: E402


def add_arguments(parser):
    parser.add_argument("--image-size", type=int, default=32,
                        help="images are resized to SIZE x SIZE (default 32)")


def bind(args):
    if not 4 <= args.image_size <= 512:
        raise DatasetError(f"--image-size must be between 4 and 512, got {args.image_size}")
    return wilds_loader("Camelyon17", args.image_size), None, {"image_size": args.image_size}


if __name__ == "__main__":
    sys.exit(main(None, "Camelyon17", None, HERE, natural=True, default_num_clients=None,
                  raw_dir_help="the WILDS folder (metadata.csv and images)",
                  add_arguments=add_arguments, bind=bind))
