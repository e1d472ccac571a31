"""Generate federated MNIST (PFLlib-compatible CLI).

Run from ``dataset/``: ``python generate_MNIST.py noniid - dir`` downloads the four
IDX files from the ossci-datasets mirror (then yann.lecun.com), checks their MD5
and writes ``dataset/MNIST``. Offline: ``--raw-dir FOLDER`` with the four files
(gzip or not). ``--help`` lists every option.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.sources import load_mnist  # noqa: E402

RAW_HELP = ("folder holding train-images-idx3-ubyte, train-labels-idx1-ubyte, "
            "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each .gz or not); skips the download")

if __name__ == "__main__":
    sys.exit(main(None, "MNIST", load_mnist, HERE, raw_dir_help=RAW_HELP))
