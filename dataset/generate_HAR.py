"""Generate federated UCI HAR: one client per subject (PFLlib's real-world scenario).

Run from ``dataset/``: ``python generate_HAR.py`` downloads 'UCI HAR Dataset.zip'
from UCI and writes one client per subject (30), each split 75/25. Inputs are the
9 inertial signals x 128 steps as (9, 1, 128), PFLlib's HARCNN layout. Offline:
``--raw-dir`` with the zip or the extracted folder. ``noniid - dir`` etc.
re-partition the windows instead.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.har import HAR_RAW_HELP, load_har  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(None, "HAR", load_har, HERE, num_classes=6, natural=True, default_num_clients=None,
                  raw_dir_help=HAR_RAW_HELP))
