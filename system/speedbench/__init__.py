"""The speed benchmark (``python benchmark.py``), one concern a module: the configurations
(`configs`), their data (`data`), one run in its own process (`worker`), PFLlib's own run beside
ours (`pfllib`) and the printed table (`tables`)."""
