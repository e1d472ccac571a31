"""Generate federated StackOverflow (TensorFlow Federated's): one client per user, next-word or tag prediction.

Run from ``dataset/``: ``python generate_StackOverflow.py`` downloads TFF's
``stackoverflow.sqlite.lzma`` and ``stackoverflow.word_count.tar.bz2`` (``--raw-dir DIR`` reads
them, or the decompressed ``stackoverflow.sqlite``, from DIR). ``--num-clients 1000`` keeps the
1,000 users with most sentences; all 342,477 otherwise. Inputs are 20 token ids (a sentence up
to a position), the label the next id of TFF's 10,004 (``datagen/stackoverflow.py`` gives every
choice and its source). Written in the packed layout; train with ``-m LSTM``.

``--task tag`` writes TFF's tag prediction instead (it also reads ``stackoverflow.tag_count.tar.bz2``):
one sample per example, the word ids of its tokens and title (``--max-len``, default 128) and
the ids of its tags among the ``--tag-vocab-size`` (500) most frequent, -1-padded to 5
(``"label_type": "multilabel"`` in config.json).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen import stackoverflow  # noqa: E402
from datagen.streamed import main_streamed  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_streamed(None, "StackOverflow", HERE, stackoverflow.open_stackoverflow,
                           raw_dir_help=stackoverflow.RAW_HELP, add_arguments=stackoverflow.add_arguments,
                           extra_options=stackoverflow.extra_options, official_test=True))
