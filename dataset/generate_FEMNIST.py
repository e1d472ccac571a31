"""Generate federated FEMNIST from LEAF's JSON folder: one client per writer.

Run from ``dataset/``: ``python generate_FEMNIST.py --raw-dir LEAF/data/femnist/data``
keeps the 100 writers with the most samples (PFLlib's default; ``--num-clients``
changes it), 62 classes, 28x28 images. LEAF's JSON is read without pickle.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.leaf import LEAF_RAW_HELP, load_femnist  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(None, "FEMNIST", load_femnist, HERE, num_classes=62, natural=True,
                  default_num_clients=100, raw_dir_help=LEAF_RAW_HELP.format(name="FEMNIST")))
