"""Generate federated iWildCam (camera-trap species, one client per camera location).

Run from ``dataset/``: ``python generate_iWildCam.py --raw-dir WILDS_FOLDER``, with the folder
``wilds.get_dataset(..., download=True)`` made (see utils/wilds_sources.py).
Images are resized to ``--image-size`` (default 64).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # our utils/, never system/utils

from utils.dataset_utils import main  # noqa: E402
from utils.errors import DatasetError  # noqa: E402
from utils.wilds_sources import wilds_loader  # noqa: E402


def add_arguments(parser):
    parser.add_argument("--image-size", type=int, default=64,
                        help="images are resized to SIZE x SIZE (default 64)")


def bind(args):
    if not 4 <= args.image_size <= 512:
        raise DatasetError(f"--image-size must be between 4 and 512, got {args.image_size}")
    return wilds_loader("iWildCam", args.image_size), None, {"image_size": args.image_size}


if __name__ == "__main__":
    sys.exit(main(None, "iWildCam", None, HERE, natural=True, default_num_clients=None,
                  raw_dir_help="the WILDS folder (metadata.csv and images)",
                  add_arguments=add_arguments, bind=bind))
