"""Generate federated Fashion-MNIST (PFLlib-compatible CLI).

Run from ``dataset/``: ``python generate_FashionMNIST.py noniid - dir`` downloads the
four IDX files from Zalando's mirror, checks their MD5 and writes
``dataset/FashionMNIST``. Offline: ``--raw-dir FOLDER`` with the four files (gzip or
not), e.g. ``--raw-dir /usr/share/datasets/fashion-mnist`` from the Debian package
``dataset-fashion-mnist``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.sources import load_fashion_mnist  # noqa: E402

RAW_HELP = ("folder holding train-images-idx3-ubyte, train-labels-idx1-ubyte, "
            "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each .gz or not), e.g. "
            "/usr/share/datasets/fashion-mnist; skips the download")

if __name__ == "__main__":
    sys.exit(main(None, "FashionMNIST", load_fashion_mnist, HERE, raw_dir_help=RAW_HELP))
