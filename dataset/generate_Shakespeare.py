"""Generate federated Shakespeare (LEAF's next-character task): one client per speaking role.

Run from ``dataset/``: ``python generate_Shakespeare.py --raw-dir LEAF/data/shakespeare/data``.
Inputs are 80 character ids (1 + the letter's index in LEAF's 80-letter alphabet; 0 is
padding), the label is the next character's index (80 classes); config.json records
``vocab_size`` 81, which main.py uses when ``-vs`` is not given. All roles are kept unless
``--num-clients N`` keeps the N largest.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.leaf import LEAF_RAW_HELP, SHAKESPEARE_LETTERS, load_shakespeare  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(None, "Shakespeare", load_shakespeare, HERE, num_classes=len(SHAKESPEARE_LETTERS),
                  natural=True, default_num_clients=None,
                  raw_dir_help=LEAF_RAW_HELP.format(name="Shakespeare")))
