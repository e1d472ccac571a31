"""Helpers of the federated dataset generators in ``dataset/`` (partitioners, readers, downloads).

Imported as ``datagen`` with ``dataset/`` on ``sys.path``: the ``generate_*.py`` scripts put
their own folder there, the tests do the same (``tests/conftest.py``). The name differs from the
simulator's ``system/utils`` so that no import depends on which folder comes first on
``sys.path`` (``tests/dataset/test_datagen_imports.py`` keeps it so). The modules import each
other relatively.
"""
