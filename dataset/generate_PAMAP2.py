"""Generate federated PAMAP2: one client per subject, windows of 27 IMU channels.

Run from ``dataset/``: ``python generate_PAMAP2.py`` downloads PAMAP2_Dataset.zip from
UCI and cuts each subject's protocol recording into windows (``--window 256 --step
128``, see datagen/pamap2.py); ``--optional`` adds the optional recordings.
Offline: ``--raw-dir``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.pamap2 import ACTIVITIES, PAMAP2_RAW_HELP, pamap2_loader  # noqa: E402


def add_arguments(parser):
    parser.add_argument("--window", type=int, default=256, help="window length in steps (default 256)")
    parser.add_argument("--step", type=int, default=128, help="steps between windows (default 128)")
    parser.add_argument("--optional", action="store_true",
                        help="also read the Optional/ recordings (their protocol activities)")


def bind(args):
    return pamap2_loader(args.window, args.step, args.optional), len(ACTIVITIES), {
        "window": args.window, "step": args.step, "optional": args.optional}


if __name__ == "__main__":
    sys.exit(main(None, "PAMAP2", None, HERE, natural=True, default_num_clients=None,
                  raw_dir_help=PAMAP2_RAW_HELP, add_arguments=add_arguments, bind=bind))
