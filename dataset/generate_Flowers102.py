"""Generate federated Flowers102 (102 classes, VGG Oxford).

Run from ``dataset/``: ``python generate_Flowers102.py noniid - dir``; images are resized to
``--image-size`` and read from the archives without extracting them. Sources, splits
and checksums: utils/image_datasets.py. Offline: ``--raw-dir``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # our utils/, never system/utils

from utils.dataset_utils import main  # noqa: E402
from utils.image_datasets import LOADERS, add_image_arguments, binder  # noqa: E402

SPEC = LOADERS["Flowers102"][0]

if __name__ == "__main__":
    sys.exit(main(None, "Flowers102", None, HERE, raw_dir_help=SPEC.raw_help,
                  natural=False, default_num_clients=20,
                  add_arguments=add_image_arguments(SPEC), bind=binder("Flowers102")))
