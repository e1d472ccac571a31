"""Generate federated CIFAR-100 (PFLlib-compatible CLI).

Run from ``dataset/``: ``python generate_Cifar100.py noniid - dir`` downloads
cifar-100-python.tar.gz from the authors' site (as torchvision and PFLlib do),
checks its MD5 and those of its three pickles, and reads them with an unpickler
that can rebuild nothing but arrays. Offline: ``--raw-dir`` with the python or
binary version (folder or tarball). Labels are the 100 fine classes.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.image_sources import CIFAR100_RAW_HELP, load_cifar100  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(None, "Cifar100", load_cifar100, HERE, num_classes=100,
                  raw_dir_help=CIFAR100_RAW_HELP))
