"""Live views of a running experiment, as callbacks of ``Server.train(callbacks=[...])``.

``--tensorboard DIR`` writes TensorBoard scalars after every round into
``DIR/<dataset>_<algorithm>_<goal>_<run>/`` (the result file's name, so repeats and algorithms
are separate runs in TensorBoard): ``test/acc``, ``test/auc``, ``train/loss`` (and
``test/acc_global`` for personalised algorithms with a shared model) at every evaluation, and
``round/seconds``, ``round/bytes_up``, ``round/bytes_down`` after every training round. The
step is the round number as on the accuracy curve: an evaluation at round r is step r, and the
time and traffic of training round t (which produce the model evaluated at round t + 1) are
step t + 1. View with ``tensorboard --logdir DIR``.

TensorBoard is optional (``torch.utils.tensorboard`` needs the ``tensorboard`` package): without
it, ``--tensorboard`` is refused with one line when the flags are read, before any data is
loaded. A callback keeps only its writer, which holds no experiment state (what the checkpoint
must restore lives in the server's history); a resumed run simply appends to the same folder.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

from utils.errors import FLError

Callback = Callable[[Any, Any], "bool | None"]


def require_tensorboard() -> None:
    """Raise an FLError saying how to install TensorBoard when it is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise FLError("--tensorboard needs the tensorboard package, which is not installed; "
                      "install it with `pip install tensorboard` (or drop --tensorboard)")


def tensorboard_dir(text: str) -> str:
    """argparse type of ``--tensorboard``: the folder, refused at once when TensorBoard is missing."""
    if not text:
        raise FLError("--tensorboard needs a folder name")
    require_tensorboard()
    return text


class TensorBoardScalars:
    """Callback ``(server, result)``: the round's scalars into a TensorBoard event file."""

    def __init__(self, log_dir: str | Path):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter  # imported only when asked for

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def __call__(self, server: Any, result: Any) -> None:
        history, scalars = server.history, {}
        if result.evaluation is not None:
            scalars.update({"test/acc": history.test_acc[-1], "test/auc": history.test_auc[-1],
                            "train/loss": history.train_loss[-1]})
            global_acc = history.extra_series.get("test_acc_global")
            if global_acc:
                scalars["test/acc_global"] = global_acc[-1]
            self._write(scalars, result.round)
        if result.trained:  # record_round ran first: the round's time and traffic are the last entries
            self._write({"round/seconds": history.round_time[-1], "round/bytes_up": history.bytes_up[-1],
                         "round/bytes_down": history.bytes_down[-1]}, result.round + 1)
        self.writer.flush()  # a live view: every round is on disk when the round ends
        if result.round >= int(server.args.global_rounds):
            self.writer.close()

    def _write(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, float(value), step)


def live_callbacks(args: Any, run_index: int) -> list[Callback]:
    """The callbacks the flags ask for, for run ``run_index`` of ``-t`` (none by default)."""
    callbacks: list[Callback] = []
    if args.tensorboard:
        name = f"{Path(args.dataset).name}_{args.algorithm}_{args.goal}_{run_index}"
        callbacks.append(TensorBoardScalars(Path(args.tensorboard) / name))
    return callbacks
