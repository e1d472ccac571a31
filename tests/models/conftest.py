"""The ``slow`` mark: models of tens of millions of parameters (seconds each on a 2-core CPU).

They run with the rest of the suite; ``pytest -m "not slow"`` leaves them out while developing."""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: builds a model of tens of millions of parameters")
