"""Helpers for algorithm tests: parsed arguments, in-memory datasets, tiny models, servers, rounds,
hand-computed linear models, log capture and runs through ``main``."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import main
from flcore.clients.clientbase import Client
from flcore.protocol import ClientUpdate, RoundPackage
from flcore.registry import ALGORITHMS, load_all
from flcore.servers.serverbase import Server
from toydata import make_dataset
from fldata.loading import ClientData, FederatedDataset
from fldata.public import with_public_data


def make_args(algorithm: str = "FedAvg", *extra: str, **flags) -> "main.argparse.Namespace":
    """Arguments exactly as ``main.py`` parses them; ``flags`` are given as ``--name value``."""
    argv = ["-algo", algorithm, "-dev", "cpu", "--progress", "False", "-q", "True"]
    for name, value in flags.items():
        argv += [f"--{name}", str(value)]
    return main.parse_args(argv + list(extra))


def dataset_from_arrays(clients: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                        num_classes: int) -> FederatedDataset:
    """A FederatedDataset held in memory: one (train_x, train_y, test_x, test_y) per client."""
    data = [ClientData(i, *(t.clone() for t in c)) for i, c in enumerate(clients)]
    config = {"num_clients": len(data), "num_classes": num_classes, "input_shape": list(data[0].train_x.shape[1:])}
    return FederatedDataset(name="memory", path=Path("."), config=config, clients=data)


def random_dataset(num_clients: int = 3, dim: int = 5, num_classes: int = 3, sizes: Sequence[int] | None = None,
                   seed: int = 0) -> FederatedDataset:
    g = torch.Generator().manual_seed(seed)
    sizes = sizes or [8 + 3 * i for i in range(num_clients)]
    clients = []
    for n in sizes:
        clients.append((torch.randn(n, dim, generator=g), torch.randint(0, num_classes, (n,), generator=g),
                        torch.randn(6, dim, generator=g), torch.randint(0, num_classes, (6,), generator=g)))
    return dataset_from_arrays(clients, num_classes)


class TinyLinear(nn.Module):
    """A linear classifier split as body (identity) and head, for hand computations."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.body = nn.Identity()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def build_server(args, dataset: FederatedDataset, module: nn.Module | None = None):
    load_all()
    if module is None:
        torch.manual_seed(0)
        module = TinyLinear(dataset.input_shape[0], dataset.num_classes)
    dataset = with_public_data(args, dataset)  # --public_data, as main.py does
    return ALGORITHMS.get(args.algorithm)(args, dataset, module, torch.device("cpu"))


def two_client_server(algorithm: str, *flags: str, seed: int, **settings):
    """The set-up of the by-hand tests, as (dataset, server): two clients of 4 and 6 samples, so the
    sample-weighted mean is 0.4 / 0.6, with 2 features and 2 classes; by default one full batch per
    epoch and two local epochs, so each local step is one full-batch gradient step."""
    data = random_dataset(num_clients=2, dim=2, num_classes=2, sizes=[4, 6], seed=seed)
    settings = {"batch_size": 6, "local_epochs": 2, "drop_last": False, **settings}
    return data, build_server(make_args(algorithm, *flags, **settings), data)


def trained_server(data: FederatedDataset, algorithm: str, *flags: str, **settings):
    """A server after a whole ``Server.train`` run (every round, with evaluation) on ``data``."""
    server = build_server(make_args(algorithm, *flags, **settings), data)
    server.train(progress=False)
    return server


class Round(NamedTuple):
    """What :func:`run_round` did: the cohort, the package sent to it, and the uploads that arrived."""

    cohort: list[int]
    package: RoundPackage
    updates: list[ClientUpdate]


def run_round(server, rnd: int, cohort: list[int] | None = None) -> Round:
    """One round of ``Server.train`` without evaluation or history; ``cohort`` replaces the selection."""
    result = server.run_round(rnd, evaluate=False, cohort=cohort)
    return Round(result.cohort, result.package, result.updates)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is fastest (more add tens of ms per step on a busy machine)
    and is immune to a busy machine's descheduling.

    pytest finds fixtures among a module's globals, so importing this one switches it on there.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Hand computations flatten TinyLinear (and nn.Linear) the way the platform does: w = [W.flatten(), b].
def linear_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean cross-entropy of the linear model w = [W.flatten(), b] on (x, y)."""
    dim = x.shape[1]
    logits = x @ w[: dim * num_classes].view(num_classes, dim).T + w[dim * num_classes:]
    return F.cross_entropy(logits, y)


def linear_grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """∇ of :func:`linear_loss` at w, in w's dtype (tests pass float64 to stay clear of rounding)."""
    w = w.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(linear_loss(w, x, y, num_classes), w)
    return grad


def gradient_descent(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_classes: int, steps: int,
                     lr: float) -> torch.Tensor:
    """``steps`` full-batch gradient steps on :func:`linear_loss` from w: plain local SGD by hand."""
    for _ in range(steps):
        w = w - lr * linear_grad(w, x, y, num_classes)
    return w.detach()


class _Collect(logging.Handler):
    def __init__(self, level: int, sink):
        super().__init__(level)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink(record)


@contextmanager
def _collecting(level: int, sink) -> Iterator[None]:
    """Pass every record of the ``fl`` logger at ``level`` or above to ``sink`` while the block runs.

    The logger's own level is set to ``level`` for the block: a quiet ``main`` run leaves it at WARNING,
    which would hide INFO messages.
    """
    handler = _Collect(level, sink)
    logger = logging.getLogger("fl")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@contextmanager
def fl_log_messages(level: int = logging.WARNING) -> Iterator[list[str]]:
    """The messages of the ``fl`` logger at ``level`` or above, as they are logged in the block."""
    messages: list[str] = []
    with _collecting(level, lambda record: messages.append(record.getMessage())):
        yield messages


@contextmanager
def fl_log_records(level: int = logging.WARNING) -> Iterator[list[logging.LogRecord]]:
    """The records (message and level) of the ``fl`` logger at ``level`` or above, as they are logged."""
    records: list[logging.LogRecord] = []
    with _collecting(level, records.append):
        yield records


@pytest.fixture
def notices() -> Iterator[list[logging.LogRecord]]:
    """Every record of the ``fl`` logger during the test (a test module imports the fixture to use it)."""
    with fl_log_records(logging.DEBUG) as records:
        yield records


def run_main_two_rounds(tmp_path: Path, algorithm: str, *flags: str, num_clients: int = 4) -> Path:
    """Two rounds of ``main.main`` with the DNN on toy 8x8 images, on the CPU; returns the results file."""
    folder = make_dataset(tmp_path, num_clients=num_clients, input_shape=(1, 8, 8))
    results = tmp_path / "res"
    rc = main.main(["-data", str(folder), "--results_dir", str(results), "-dev", "cpu", "-gr", "2", "-m", "DNN",
                    "-algo", algorithm, *flags, "--progress", "False", "-q", "True", "--save_model", "False"])
    assert rc == 0, f"main exited with {rc}"
    files = sorted(results.glob("*.h5"))
    assert len(files) == 1, files
    return files[0]


# ---------------------------------------------------------------- comparing training engines
#: flags without which an algorithm refuses to run (a public dataset: 10% of the toy training pool)
REQUIRED_FLAGS = {"KT-pFL": ["--public_data", "0.1"], "Sageflow": ["--public_data", "0.1"]}
#: flags that make an algorithm's extra terms non-trivial in engine comparisons (only if it has them)
#: (FedGen: a small generator trained 20 steps a round keeps its term on at a test's cost)
ENGINE_EXTRA_FLAGS = {"FedProx": ["-mu", "0.1"], "MOON": ["-mu", "1"], "FedNTD": ["-bt", "1"], "FedLC": ["-tau", "2"],
                      "FedDyn": ["-al", "0.1"], "FedGen": ["-se", "20", "-nd", "16", "-hd", "16"],
                      # pruning in every round it may, whatever the toy accuracy
                      "LotteryFL": ["--acc_threshold=-1", "--prune_rate", "0.5"],
                      "Hermes": ["--acc_threshold=-1", "--prune_rate", "0.5"], **REQUIRED_FLAGS}
#: ragged client sizes: with batch 5, 0 steps (3 < 5) and 2..8 steps
ENGINE_SIZES = [3, 12, 25, 40, 17]


def engine_run(algo: str, engine: str, dataset: FederatedDataset | None = None, module_fn=None, **flags):
    """A whole ``Server.train`` run (3 rounds, batch 5, 60% participation, learning-rate decay) on
    ragged toy data with ``--engine engine``; ``module_fn(dataset)`` replaces the tiny linear model."""
    dataset = dataset or random_dataset(num_clients=5, dim=6, num_classes=3, sizes=ENGINE_SIZES, seed=1)
    base = dict(engine=engine, global_rounds=3, batch_size=5, local_learning_rate=0.05, join_ratio=0.6,
                eval_auc=False, save_model=False)
    base.update(flags)
    try:
        args = make_args(algo, *ENGINE_EXTRA_FLAGS.get(algo, []), "-ld", "True", **base)
    except SystemExit:  # an algorithm without the extra flag
        args = make_args(algo, "-ld", "True", **base)
    module = None
    if module_fn is not None:
        torch.manual_seed(0)
        module = module_fn(dataset)
    server = build_server(args, dataset, module)
    server.train(progress=False)
    return server


def sequential_reference(algo: str, **kwargs):
    """``engine_run`` with the sequential engine, or a skip when the algorithm itself fails on toy data."""
    try:
        return engine_run(algo, "sequential", **kwargs)
    except Exception as exc:  # noqa: BLE001 - the algorithm itself fails here, not the engine
        pytest.skip(f"{algo} does not run with the sequential engine on this toy set-up: {exc!r}")


def assert_same_training(ref, other, exact: bool = False, atol: float = 0.0, rtol: float = 0.0) -> None:
    """Two finished runs agree: global model, every client's evaluated model, participations, per-client
    state and the accuracy curve; to the last bit with ``exact``, else within ``atol``/``rtol``."""
    def check(a, b):
        return torch.equal(a, b) if exact else torch.allclose(a, b, atol=atol, rtol=rtol)

    assert check(ref.global_params, other.global_params), (ref.global_params - other.global_params).abs().max()
    for i in range(len(ref.clients)):
        assert check(ref.eval_params(i), other.eval_params(i)), f"client {i}'s evaluated model differs"
        assert ref.clients[i].participations == other.clients[i].participations
    names = set(ref.state.names())
    assert names == set(other.state.names())
    for name in names:
        assert ref.state.indices(name) == other.state.indices(name)
        for i in ref.state.indices(name):
            assert check(ref.state.get(name, i), other.state.get(name, i)), f"state {name}[{i}] differs"
    if exact:
        assert ref.history.test_acc == other.history.test_acc
        assert ref.history.train_loss == other.history.train_loss
    else:
        assert ref.history.test_acc == pytest.approx(other.history.test_acc, abs=1e-6)


def image_dataset(sizes: Sequence[int], shape: tuple[int, ...] = (1, 16, 16), num_classes: int = 4,
                  seed: int = 0) -> FederatedDataset:
    """Random images, ``sizes[i]`` training and 4 test samples for client i."""
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(n, *shape, generator=g), torch.randint(0, num_classes, (n,), generator=g),
                torch.randn(4, *shape, generator=g), torch.randint(0, num_classes, (4,), generator=g)) for n in sizes]
    return dataset_from_arrays(clients, num_classes)


class OwnLoopClient(Client):
    """A client that does not promise the batched/threaded engines' contract."""

    vectorisable = False


class OwnLoopServer(Server):
    client_cls = OwnLoopClient
