"""Generate federated iWildCam (camera-trap species, one client per camera location).

Run from ``dataset/``: ``python generate_iWildCam.py --raw-dir WILDS_FOLDER``, with the folder
``wilds.get_dataset(..., download=True)`` made (see datagen/wilds_sources.py).
Images are resized to ``--image-size`` (default 64).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.wilds_sources import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("iWildCam", HERE))
