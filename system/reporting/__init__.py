"""Reading, summarising and plotting result files; used by plot.py, summarize.py, report.py and
sweep.py. Each module is one concern, each imports only those above it in this list:

* :mod:`reporting.names`: result-file names (``<dataset>_<algorithm>_<goal>_<run>.h5``), finding
  them, and the command that makes missing ones;
* :mod:`reporting.loading`: reading an ``.h5`` file (ours or PFLlib's) into a ``RunResult``;
* :mod:`reporting.settings`: splitting runs of one name made with different flags;
* :mod:`reporting.series`: mean ± std curves over runs;
* :mod:`reporting.stats`: the summary table's figures, each defined once;
* :mod:`reporting.tables`: the table as text, Markdown and CSV;
* :mod:`reporting.plots`: drawing curves (matplotlib, Agg);
* :mod:`reporting.cli`: what the tools share on the command line.

Nothing here imports torch or ``flcore``: whether an algorithm evaluates personal models is read
from the ``personalized`` attribute main.py writes into each file (for files without it, see
``RunResult.personalized``), and the registered algorithm names from the source text
(``names.known_algorithms``). ``tests/reporting/test_no_torch.py`` checks this.
"""
