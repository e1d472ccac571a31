"""Generate federated Camelyon17 (tumour patches of 5 hospitals, one client per hospital).

Run from ``dataset/``: ``python generate_Camelyon17.py --raw-dir WILDS_FOLDER``, with the folder
``wilds.get_dataset(..., download=True)`` made (see datagen/wilds_sources.py).
Images are resized to ``--image-size`` (default 32).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.wilds_sources import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("Camelyon17", HERE))
