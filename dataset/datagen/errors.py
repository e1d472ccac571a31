"""Error types the generators report to users as one line (``error: ...``)."""


class DatasetError(Exception):
    """A problem the user can fix (bad option, missing or corrupt file, no network)."""


class PartitionError(DatasetError, ValueError):
    """Partition settings that cannot be satisfied (also a ``ValueError``)."""


class ReadError(DatasetError):
    """A raw dataset file is missing, truncated or not in the expected format."""


class DownloadError(DatasetError):
    """A download failed; the message tells the user how to use ``--raw-dir`` instead."""


class ChecksumError(DatasetError):
    """A file's MD5 digest differs from the published one."""
