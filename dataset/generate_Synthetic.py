"""Generate FedProx's Synthetic(alpha, beta) federated data (offline, seconds).

``python generate_Synthetic.py`` writes Synthetic(1, 1) with 30 clients to
``dataset/Synthetic``; ``--synthetic-alpha 0.5 --synthetic-beta 0.5`` writes
``dataset/Synthetic_0.5_0.5`` and ``--iid`` writes ``dataset/Synthetic_iid``.
Features are float32 vectors ([n, 60] by default), labels int64.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main_synthetic  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_synthetic(None, HERE))
