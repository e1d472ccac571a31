"""Privacy attacks run against what clients upload (``-dlg``: :mod:`flcore.attacks.dlg`)."""
