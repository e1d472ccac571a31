"""Generate federated AG News (4 classes), tokenised with Hugging Face tokenizers.

Run from ``dataset/``: ``python generate_AGNews.py noniid - dir`` downloads train.csv
and test.csv (torchtext's source, published MD5s), trains a word-level vocabulary on
the training split and stores token ids (``--vocab-size``, ``--max-len``,
``--tokenizer bpe``). Offline: ``--raw-dir`` with the two CSV files or ag_news_csv.tar.gz.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.text import (AG_NEWS_CLASSES, AG_NEWS_FILES, AG_NEWS_MIRRORS, CSV_RAW_HELP,  # noqa: E402
                        add_text_arguments, news_binder)


if __name__ == "__main__":
    sys.exit(main(None, "AGNews", None, HERE,
                  raw_dir_help=CSV_RAW_HELP.format(archive="ag_news_csv.tar.gz"),
                  add_arguments=add_text_arguments,
                  bind=news_binder("AGNews", AG_NEWS_CLASSES, "ag_news_csv.tar.gz", AG_NEWS_FILES,
                                   AG_NEWS_MIRRORS)))
