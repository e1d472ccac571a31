"""Generate AmazonReview (feature shift): one client per product domain (books, dvd,
electronics, kitchen), 5,000 bag-of-words features, binary sentiment.

Run from ``dataset/``: ``python generate_AmazonReview.py --raw-dir FOLDER`` with KD3A's
amazon.npz (plain arrays, read without pickle; see datagen/misc_sources.py).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.misc_sources import AMAZON_RAW_HELP, load_amazon_review  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(None, "AmazonReview", load_amazon_review, HERE, num_classes=2, natural=True,
                  default_num_clients=None, raw_dir_help=AMAZON_RAW_HELP))
