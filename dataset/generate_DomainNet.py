"""Generate DomainNet (feature shift): one client per domain (clipart, infograph, painting,
quickdraw, real, sketch).

Run from ``dataset/``: ``python generate_DomainNet.py`` downloads the domain zips from
the VisDA server (no published checksums) and keeps FedBN's ten classes
(``--classes all`` keeps the 345), resized to ``--image-size`` (default 64).
``--domains real sketch`` keeps some domains. Offline: ``--raw-dir``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # datagen/ sits beside this script

from datagen.dataset_utils import main  # noqa: E402
from datagen.image_folders import add_image_size_argument, check_image_size  # noqa: E402
from datagen.image_datasets import (DOMAINNET, DOMAINNET_CLASSES, DOMAINNET_DOMAINS,  # noqa: E402
                                  load_domainnet)


def add_arguments(parser):
    parser.add_argument("--domains", nargs="+", choices=DOMAINNET_DOMAINS,
                        default=list(DOMAINNET_DOMAINS), help="domains, one client each (default all)")
    parser.add_argument("--classes", nargs="+", default=list(DOMAINNET_CLASSES),
                        help="class names to keep, or 'all' (default FedBN's ten)")
    add_image_size_argument(parser, DOMAINNET.image_size)


def bind(args):
    check_image_size(args.image_size)
    domains = tuple(dict.fromkeys(args.domains))
    classes = None if args.classes == ["all"] else tuple(sorted(set(args.classes)))

    def loader(raw_dir, download_dir):
        return load_domainnet(raw_dir, download_dir, domains, classes, args.image_size)
    return loader, None if classes is None else len(classes), {
        "domains": list(domains), "classes": "all" if classes is None else list(classes),
        "image_size": args.image_size}


if __name__ == "__main__":
    sys.exit(main(None, "DomainNet", None, HERE, natural=True, default_num_clients=None,
                  raw_dir_help=DOMAINNET.raw_help, add_arguments=add_arguments, bind=bind))
