"""Generate federated Sogou News (5 classes, pinyin text), tokenised like AG News.

The dataset (sogou_news_csv.tar.gz, Zhang et al. 2015) is only on Google Drive,
which serves no direct link: download it by hand and pass ``--raw-dir`` with the
tarball or its train.csv and test.csv. See generate_AGNews.py for the text options.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.text import CSV_RAW_HELP, SOGOU_NEWS_CLASSES, add_text_arguments, news_binder  # noqa: E402


if __name__ == "__main__":
    sys.exit(main(None, "SogouNews", None, HERE,
                  raw_dir_help=CSV_RAW_HELP.format(archive="sogou_news_csv.tar.gz"),
                  add_arguments=add_text_arguments,
                  bind=news_binder("SogouNews", SOGOU_NEWS_CLASSES, "sogou_news_csv.tar.gz", None, ())))
