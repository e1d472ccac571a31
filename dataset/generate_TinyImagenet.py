"""Generate federated TinyImagenet (200 classes, 64x64; --splits train val adds the validation images with their real labels).

Run from ``dataset/``: ``python generate_TinyImagenet.py noniid - dir``; images are resized to
``--image-size`` and read from the archives without extracting them. Sources, splits
and checksums: datagen/image_datasets.py. Offline: ``--raw-dir``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.image_datasets import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("TinyImagenet", HERE))
