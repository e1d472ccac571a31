"""Checksummed downloads from a dataset's official mirrors.

Each file is streamed into a temporary file next to its destination and renamed
into place only after its MD5 matches the published digest, so an interrupted
or corrupted download never leaves a file that looks complete. Every mirror is
tried in turn, each with a few attempts and exponential backoff.

The mirror list can be replaced by a parameter or by the environment variable
``FL_DATASET_MIRROR`` (comma-separated base URLs), which the tests use to point
at a local HTTP server. When nothing can be fetched the error is one line that
tells the user to fetch the files by hand and pass ``--raw-dir``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import quote, urlsplit

from .errors import ChecksumError, DownloadError

MIRROR_ENV = "FL_DATASET_MIRROR"


@dataclass(frozen=True)
class RemoteFile:
    """A file on the mirrors: its name relative to a base URL and its published MD5.

    ``md5`` is None where the source publishes no checksum (UCI, LEAF's sources);
    such files are checked by format when read, and a complete copy already in
    the download folder is reused (only complete files are ever renamed there).
    ``sha256`` is the digest where the source publishes SHA-256 instead (TensorFlow
    Federated's files); it is checked like the MD5.
    """

    name: str
    md5: str | None
    sha256: str | None = None

    def mismatch(self, digests: dict[str, str]) -> str | None:
        """What differs between the published digests and ``digests`` (name -> hex), or None."""
        for kind, label in (("md5", "MD5"), ("sha256", "SHA-256")):
            published = getattr(self, kind)
            if published is not None and digests[kind] != published:
                return f"{label} {digests[kind]} differs from the published {published}"
        return None


MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "http://yann.lecun.com/exdb/mnist/")
MNIST_FILES = (
    RemoteFile("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
    RemoteFile("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
    RemoteFile("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
    RemoteFile("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
)
FASHION_MNIST_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
FASHION_MNIST_FILES = (
    RemoteFile("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    RemoteFile("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
    RemoteFile("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
    RemoteFile("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
)
CIFAR10_MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
CIFAR10_FILES = (RemoteFile("cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530"),)


def _digests() -> dict:
    return {"md5": hashlib.md5(usedforsecurity=False), "sha256": hashlib.sha256()}


def file_digests(path: str | Path) -> dict[str, str]:
    """Hex MD5 and SHA-256 digests of a file, read in blocks."""
    digests = _digests()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            for digest in digests.values():
                digest.update(block)
    return {kind: digest.hexdigest() for kind, digest in digests.items()}


def file_md5(path: str | Path) -> str:
    """Hex MD5 digest of a file, read in blocks."""
    return file_digests(path)["md5"]


def mirrors_from_env(default: Sequence[str]) -> list[str]:
    """The mirrors to use: ``$FL_DATASET_MIRROR`` if set, else ``default``."""
    value = os.environ.get(MIRROR_ENV, "").strip()
    return [m.strip() for m in value.split(",") if m.strip()] if value else list(default)


def _fetch_once(url: str, dest: Path, remote: RemoteFile, timeout: float) -> None:
    """One attempt: stream ``url`` into a temp file, check the digests, rename to ``dest``."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digests = _digests()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            for block in iter(lambda: resp.read(1 << 20), b""):
                for digest in digests.values():
                    digest.update(block)
                out.write(block)
        wrong = remote.mismatch({kind: digest.hexdigest() for kind, digest in digests.items()})
        if wrong is not None:
            raise ChecksumError(f"{url}: {wrong}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return getattr(reason, "strerror", None) or str(reason)
    return str(exc) or type(exc).__name__


def download_file(remote: RemoteFile, dest_dir: str | Path, mirrors: Sequence[str], *,
                  attempts: int = 3, backoff: float = 1.0, timeout: float = 60.0,
                  log: bool = True) -> Path:
    """Fetch one file into ``dest_dir`` unless a copy with the right MD5 is there.

    Raises :class:`ChecksumError` when every copy served had the wrong digest and
    :class:`DownloadError` when no mirror could be reached.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / remote.name
    unchecked = remote.md5 is None and remote.sha256 is None
    if dest.is_file() and (unchecked or remote.mismatch(file_digests(dest)) is None):
        return dest
    failures: list[str] = []
    bad_checksum = False
    for base in mirrors:
        # Names with spaces (UCI's 'UCI HAR Dataset.zip') are quoted in the URL only.
        url = base.rstrip("/") + "/" + quote(remote.name)
        for attempt in range(attempts):
            if attempt:
                time.sleep(backoff * 2 ** (attempt - 1))
            if log:
                print(f"Downloading {url}")
            try:
                _fetch_once(url, dest, remote, timeout)
                return dest
            except ChecksumError as exc:
                bad_checksum = True
                failures.append(str(exc))
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                failures.append(f"{urlsplit(url).netloc}: {_reason(exc)}")
                if isinstance(exc, urllib.error.HTTPError) and exc.code == 404:
                    break  # a missing file will not appear on retry; try the next mirror
    summary = failures[-1] if failures else "no mirror configured"
    if bad_checksum:
        raise ChecksumError(f"{remote.name}: every download failed the checksum (last: {summary})")
    raise DownloadError(f"cannot download {remote.name} ({summary})")


def download_all(files: Sequence[RemoteFile], dest_dir: str | Path, mirrors: Sequence[str],
                 *, dataset: str, attempts: int = 3, backoff: float = 1.0,
                 timeout: float = 60.0) -> list[Path]:
    """Fetch every file; on failure raise one line that names ``--raw-dir`` and the files."""
    names = ", ".join(f.name for f in files)
    paths = []
    for remote in files:
        try:
            paths.append(download_file(remote, dest_dir, mirrors, attempts=attempts,
                                       backoff=backoff, timeout=timeout))
        except ChecksumError as exc:
            raise ChecksumError(f"{dataset}: {exc}; the mirror served a corrupt file, or download "
                                f"{names} yourself and pass --raw-dir FOLDER") from None
        except DownloadError as exc:
            raise DownloadError(f"{dataset}: {exc}; without network access, put {names} in a "
                                f"folder and pass --raw-dir FOLDER") from None
    return paths
