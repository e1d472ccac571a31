"""Generate federated Sent140 (LEAF's Sentiment140): one client per Twitter user, binary sentiment.

Run from ``dataset/``: ``python generate_Sent140.py`` downloads Stanford's
``trainingandtestdata.zip`` (``--raw-dir DIR`` reads it, or the extracted
``training.1600000.processed.noemoticon.csv``, from DIR) and keeps the users with more than 10
tweets (LEAF's ``-k`` default; ``--min-samples K``). Tweets become ``--max-len 25`` token ids
of the platform's tokenizer (``tokenizer.json``); labels 0 (negative) and 1 (positive).
Written in the packed layout; train with ``-m LSTM`` (``datagen/sent140.py`` gives every choice
and its source).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen import sent140  # noqa: E402
from datagen.streamed import main_streamed  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_streamed(None, "Sent140", HERE, sent140.open_sent140, raw_dir_help=sent140.RAW_HELP,
                           add_arguments=sent140.add_arguments, extra_options=sent140.extra_options))
