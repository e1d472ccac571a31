"""Generate Digit5 (feature shift): one client per domain (MNIST, MNIST-M, SVHN, SynthDigits, USPS).

Run from ``dataset/``: ``python generate_Digit5.py --raw-dir DigitFive`` with KD3A's
MAT files (see datagen/digit5.py). Images become 3x32x32; ``--domains mnist svhn``
keeps some domains; ``partition.png`` marks each client's domain.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.digit5 import DIGIT5_DOMAINS, DIGIT5_RAW_HELP, digit5_loader  # noqa: E402


def add_arguments(parser):
    parser.add_argument("--domains", nargs="+", choices=DIGIT5_DOMAINS, default=list(DIGIT5_DOMAINS),
                        help="domains to keep, one client each (default all five)")


def bind(args):
    domains = tuple(dict.fromkeys(args.domains))
    return digit5_loader(domains), 10, {"domains": list(domains)}


if __name__ == "__main__":
    sys.exit(main(None, "Digit5", None, HERE, natural=True, default_num_clients=None,
                  raw_dir_help=DIGIT5_RAW_HELP, add_arguments=add_arguments, bind=bind))
