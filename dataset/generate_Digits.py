"""Generate federated 8x8 Digits from scikit-learn's bundled copy (offline, seconds).

1,797 images stored as [n, 1, 8, 8] float32, scaled like PFLlib's images:
(pixel/16 - 0.5)/0.5 (the pixel values run from 0 to 16). Meant for smoke tests
and the README quick start: ``python generate_Digits.py noniid - dir`` (10 clients
by default).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.sources import load_digits  # noqa: E402

if __name__ == "__main__":
    # 1,797 samples: 10 clients keep PFLlib's 40-sample minimum easy to meet at alpha 0.1.
    sys.exit(main(None, "Digits", load_digits, HERE, default_num_clients=10,
                  raw_dir_help="not used: the data ships with scikit-learn"))
