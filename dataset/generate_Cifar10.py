"""Generate federated CIFAR-10 (PFLlib-compatible CLI).

Run from ``dataset/``: ``python generate_Cifar10.py noniid - dir`` downloads the
binary version (cifar-10-binary.tar.gz) from the authors' site, checks its MD5
and reads it without unpickling. Offline: ``--raw-dir`` with a
``cifar-10-batches-bin`` folder, a ``cifar-10-batches-py`` folder (read only when
every file's MD5 matches the published one), a folder holding either, or the
tar.gz itself.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.sources import load_cifar10  # noqa: E402

RAW_HELP = ("cifar-10-batches-bin or cifar-10-batches-py folder, a folder holding one, "
            "or cifar-10-binary.tar.gz / cifar-10-python.tar.gz; skips the download")

if __name__ == "__main__":
    sys.exit(main(None, "Cifar10", load_cifar10, HERE, raw_dir_help=RAW_HELP))
