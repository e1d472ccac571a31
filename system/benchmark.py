"""Speed benchmark of the training engines: seconds per round, samples per second, peak memory.

Run from ``system/``::

    python benchmark.py                       # P1 P2 P3, sequential and batched, 5 timed rounds each
    python benchmark.py --quick               # smoke run: 1 warm-up + 2 timed rounds
    python benchmark.py --only P1 --engines sequential threaded pfllib   # against PFLlib's procedure
    python benchmark.py --only P3 --engines threaded --fill-state --state-dtype float16
    python benchmark.py --only P3 --engines threaded --fill-state --state-device disk
    python benchmark.py --device cuda         # GPU (peak GPU memory reported too)
    python benchmark.py --device cuda --only P1 --engines batched batched+eager --pfllib ../PFLlib
                                              # captured vs eager cohort step, and PFLlib's own main.py
    python benchmark.py --only P1 --engines batched+bf16 --rounds 19   # 20 rounds of bf16 (--precision)
    python benchmark.py --only P2 P3 --engines sequential threaded ray   # Ray actors (needs ./prepare.sh --ray)

Engines: ``sequential``, ``threaded``, ``batched``, ``auto``, ``ray`` (the platform's engines, see
``flcore/engines``; ``ray`` starts a local Ray instance in the warm-up round, whose start-up cost
the JSON records as ``startup_s``, with the actors' state and peak memory) and ``pfllib``: PFLlib's FedAvg procedure re-implemented
(``utils/pfllib_baseline.py``), run on the same data, initial model, seed and threads, so that the
speed-up over PFLlib is measured in one run rather than against a figure from another day.

Configurations (the issue's):

* **P1**: PFLlib's README set-up: MNIST, ``CNN``, 20 clients, Dirichlet 0.1, batch 10, 1 local
  epoch, lr 0.005, full participation, evaluation every round (as PFLlib). The data are real
  MNIST partitioned by ``dataset/generate_MNIST.py`` (generated once into ``--data-dir``); where
  the generator or the raw files are missing, random class-prototype images of the same shapes
  and Dirichlet(0.1) sizes are used instead, and the table says ``synthetic``.
* **P2**: cross-device: CIFAR-10-shaped inputs [3, 32, 32], 10 classes, 1,000 clients with 50
  training samples each (plus 10 test samples), 50 clients per round, batch 10, 1 epoch, ``CNN``.
  ``--p2-data FOLDER`` uses a generated dataset folder (e.g. real CIFAR-10) instead of random
  tensors. Evaluated every ``--p2-eval-gap`` rounds (default: only outside the timed rounds, so
  the times compare training).
* **P3**: scale: P2's clients with SCAFFOLD (per-client control variates in the state store).
  The JSON records, round by round, the state bytes and the process RSS, so one sees that memory
  grows with the per-client state, not with model copies. ``--fill-state`` gives every client its
  control variate after the warm-up (as after a long run; needs ``--warmup`` >= 1), so the timed
  rounds show the memory of the full state; ``--state-dtype float16`` stores it in half the bytes
  and ``--state-device disk`` in files, outside the process's memory.

Each (configuration, engine) runs in a fresh subprocess so that the peak RSS is its own. Only
rounds are timed (``Server.train``'s per-round times: evaluation + training + aggregation); the
median is taken after ``--warmup`` rounds (the first round pays one-off costs such as functorch's
set-up). Results are printed as a table with the batched/sequential ratios and written to
``results/benchmark-<timestamp>.json``. Timings on a machine shared with other work are noisy;
the JSON stores the load average before and after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: PFLlib itself on the project's 2-core CPU for P1 (README configuration, issue 5), kept in the JSON
#: for the record only: this shared machine's speed has varied 3-4x between days, so speed-ups are
#: computed against the same-run baseline (``--engines ... pfllib``) alone
PFLLIB_P1 = {"s_per_round": 20.8, "eval_s_per_round": 7.9, "peak_rss_mb": 705.0}
#: the engine name of PFLlib's procedure re-implemented (utils/pfllib_baseline.py)
BASELINE = "pfllib"

CONFIGS: dict[str, dict] = {
    "P1": {
        "title": "MNIST CNN, 20 clients Dir(0.1), B=10, E=1, lr 0.005, all clients, eval every round",
        "algorithm": "FedAvg", "data": "mnist", "join_ratio": 1.0, "eval_gap": 1,
    },
    "P2": {
        "title": "CIFAR-10-shaped CNN, 1000 clients x 50 samples, 50 per round, B=10, E=1",
        "algorithm": "FedAvg", "data": "p2", "join_ratio": 0.05, "eval_gap": None,
    },
    "P3": {
        "title": "SCAFFOLD on P2's 1000 clients (per-client control variates), 50 per round",
        "algorithm": "SCAFFOLD", "data": "p2", "join_ratio": 0.05, "eval_gap": None,
    },
}


# ---------------------------------------------------------------------------- data
def _synthetic_clients(sizes_train, sizes_test, labels_of, shape, num_classes, seed):
    """Class-prototype images plus noise, written client by client into one tensor per split.

    Returns (clients, merged) as ``load_federated_dataset`` does: the clients' tensors are views of
    the merged ones, so the data are held once (P2/P3's 60,000 CIFAR-shaped samples: 737 MB)."""
    import numpy as np
    import torch

    from utils.data_utils import ClientData, split_views

    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(num_classes, *shape)).astype(np.float32)
    sizes = {"train": sizes_train, "test": sizes_test}
    merged = {}
    for split, counts in sizes.items():
        total = int(sum(counts))
        merged[split] = (torch.empty((total, *shape)), torch.empty(total, dtype=torch.long),
                         torch.repeat_interleave(torch.arange(len(counts)), torch.as_tensor(counts, dtype=torch.long)))
    starts = {"train": 0, "test": 0}
    for cid, (n_train, n_test) in enumerate(zip(sizes_train, sizes_test)):
        for split, n in (("train", n_train), ("test", n_test)):
            y = labels_of(cid, n, rng)
            x = prototypes[y] + rng.normal(scale=1.0, size=(n, *shape)).astype(np.float32)
            all_x, all_y, _ = merged[split]
            lo, hi = starts[split], starts[split] + n
            all_x[lo:hi].copy_(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
            all_y[lo:hi].copy_(torch.from_numpy(y.astype(np.int64)))
            starts[split] = hi
    views = {split: split_views(x, y, sizes[split]) for split, (x, y, _) in merged.items()}
    clients = [ClientData(cid, *views["train"][cid], *views["test"][cid]) for cid in range(len(sizes_train))]
    return clients, merged


def synthetic_mnist(seed: int = 1):
    """Random data shaped like P1: 70,000 1x28x28 images over 20 clients by Dirichlet(0.1), 75% train."""
    import numpy as np

    from utils.data_utils import FederatedDataset

    rng = np.random.default_rng(seed)
    num_clients, num_classes, total = 20, 10, 70_000
    props = rng.dirichlet(np.full(num_clients, 0.1), size=num_classes)  # class -> client shares
    per_class = total // num_classes
    counts = np.floor(props * per_class).astype(int)  # [class, client]
    sizes = counts.sum(0)
    train = np.floor(sizes * 0.75).astype(int)
    client_props = counts / np.maximum(sizes, 1)

    def labels_of(cid, n, r):
        p = client_props[:, cid] if sizes[cid] else np.full(num_classes, 1 / num_classes)
        return r.choice(num_classes, size=n, p=p / p.sum())

    clients, merged = _synthetic_clients(train, sizes - train, labels_of, (1, 28, 28), num_classes, seed)
    config = {"num_clients": num_clients, "num_classes": num_classes, "input_shape": [1, 28, 28]}
    return FederatedDataset(name="MNIST-synthetic", path=Path("."), config=config, clients=clients, merged=merged)


def synthetic_p2(seed: int = 2, num_clients: int = 1000, n_train: int = 50, n_test: int = 10):
    """Random CIFAR-10-shaped data: 1,000 clients with 50 train / 10 test samples, Dir(0.1) labels."""
    import numpy as np

    from utils.data_utils import FederatedDataset

    rng = np.random.default_rng(seed)
    num_classes = 10
    label_props = rng.dirichlet(np.full(num_classes, 0.1), size=num_clients)

    def labels_of(cid, n, r):
        return r.choice(num_classes, size=n, p=label_props[cid])

    clients, merged = _synthetic_clients([n_train] * num_clients, [n_test] * num_clients, labels_of, (3, 32, 32),
                                         num_classes, seed)
    config = {"num_clients": num_clients, "num_classes": num_classes, "input_shape": [3, 32, 32]}
    return FederatedDataset(name="CIFAR10-shaped-synthetic", path=Path("."), config=config, clients=clients,
                            merged=merged)


def _synthetic_data(cfg: dict, spec: dict):
    """The random data of a configuration: P1's MNIST shape, or P2/P3's CIFAR shape."""
    return synthetic_mnist() if cfg["data"] == "mnist" else synthetic_p2(num_clients=spec.get("p2_clients") or 1000)


def _move_dataset(dataset, device) -> None:
    """Move the merged tensors to ``device`` and make the clients' tensors views of them again."""
    from utils.data_utils import split_views

    dataset.merged = {split: tuple(t.to(device) for t in tensors) for split, tensors in dataset.merged.items()}
    for split, (all_x, all_y, _) in dataset.merged.items():
        sizes = [len(getattr(c, f"{split}_y")) for c in dataset.clients]
        for client, (x, y) in zip(dataset.clients, split_views(all_x, all_y, sizes)):
            setattr(client, f"{split}_x", x)
            setattr(client, f"{split}_y", y)


def prepare_mnist(data_dir: Path, raw_dir: Path) -> tuple[Path | None, str]:
    """Generate P1's MNIST folder once; (folder, note) or (None, why not)."""
    folder = data_dir / "MNIST"
    if (folder / "config.json").exists():
        return folder, "real MNIST (dataset/generate_MNIST.py noniid - dir)"
    generator = REPO / "dataset" / "generate_MNIST.py"
    if not generator.exists():
        return None, "synthetic: dataset/generate_MNIST.py is missing"
    if not raw_dir.exists():
        return None, f"synthetic: no MNIST raw files at {raw_dir}"
    cmd = [sys.executable, str(generator), "noniid", "-", "dir", "--raw-dir", str(raw_dir), "--out-dir", str(folder)]
    done = subprocess.run(cmd, cwd=generator.parent, capture_output=True, text=True)
    if done.returncode != 0 or not (folder / "config.json").exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        return None, f"synthetic: generate_MNIST.py failed ({tail[0]})"
    return folder, "real MNIST (dataset/generate_MNIST.py noniid - dir)"


# ---------------------------------------------------------------------------- worker
def _current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024**2
    except (OSError, ValueError):
        return float("nan")


#: ``--engines`` entries may carry variants: ``batched+eager``, ``batched+compiled``, ``batched+bf16``, ``auto+evaleager``,
#: ``batched+evalbs128`` (``--eval_batch_size 128``), ``batched+cudnnbench+nhwc`` (``--cudnn_benchmark``, ``--conv_layout``)
STEP_RUNNER_VARIANTS = ("eager", "graph", "compiled")
PRECISION_VARIANTS = ("fp32", "tf32", "bf16")
#: ``auto+evalfrozen``: evaluation through the frozen copies of flcore/frozen.py (opt-in: a slow memory growth remains);
#: ``auto+evaleager`` the default, spelled out
EVAL_VARIANTS = {"evaleager": ["--eval_frozen", "False"], "evalfrozen": ["--eval_frozen", "True"]}
#: process-wide switches: cuDNN's timed algorithm choice and the convolution layout (P2's grouped, vmapped
#: convolutions on a GPU); ``sequential+keepfreed`` / ``+returnfreed``: --malloc_keep_freed on / off (utils/allocator.py)
BACKEND_VARIANTS = {"cudnnbench": ["--cudnn_benchmark", "True"], "nhwc": ["--conv_layout", "channels_last"],
                    "nchw": ["--conv_layout", "nchw"],
                    "grouped": ["--batched_conv", "grouped"], "unfold": ["--batched_conv", "unfold"],
                    "groupednhwc": ["--batched_conv", "grouped_nhwc"],
                    "keepfreed": ["--malloc_keep_freed", "on"], "returnfreed": ["--malloc_keep_freed", "off"]}


def split_variant(name: str, precision: str | None = None) -> tuple[str, list[str]]:
    """(engine, extra main.py flags) of an ``--engines`` entry such as ``batched+eager+bf16``."""
    engine, *tokens = name.split("+")
    flags: list[str] = []
    for token in tokens:
        if token in STEP_RUNNER_VARIANTS:
            flags += ["--step_runner", token]
        elif token in PRECISION_VARIANTS:
            precision = token
        elif token in EVAL_VARIANTS:
            flags += EVAL_VARIANTS[token]
        elif token.startswith("evalbs") and token[6:].isdigit():  # batched+evalbs128: --eval_batch_size 128
            flags += ["--eval_batch_size", token[6:]]
        elif token in BACKEND_VARIANTS:
            flags += BACKEND_VARIANTS[token]
        else:
            raise SystemExit(f"--engines {name}: unknown variant {token!r} (step runners "
                             f"{', '.join(STEP_RUNNER_VARIANTS)}; precisions {', '.join(PRECISION_VARIANTS)}; "
                             f"evaluation {', '.join(EVAL_VARIANTS)}, evalbsN; backends {', '.join(BACKEND_VARIANTS)})")
    if precision and precision != "fp32":
        flags += ["--precision", precision]
    return engine, flags


def _build_server(spec: dict, engine: str, dataset=None):
    """(server, args, dataset) for one configuration and engine, as ``main.run`` builds it."""

    import main
    from flcore.registry import ALGORITHMS
    from utils.data_utils import load_federated_dataset
    from utils.seeding import derive_seed, seed_everything

    cfg = CONFIGS[spec["config"]]
    rounds = spec["warmup"] + spec["rounds"]
    eval_gap = cfg["eval_gap"] or spec.get("eval_gap") or rounds + 1
    engine, variant = split_variant(engine, spec.get("precision"))
    argv = [
        "-algo", cfg["algorithm"], "-m", "CNN", "-lbs", "10", "-ls", "1", "-lr", "0.005",
        "-jr", str(cfg["join_ratio"]), "-gr", str(rounds), "-eg", str(eval_gap), "-dev", spec["device"],
        "--engine", engine, "--seed", str(spec["seed"]), "--progress", "False", "-q", "True",
        "--save_model", "False",
    ]
    if engine in ("batched", "auto") and spec.get("chunk"):
        argv += ["--cohort_chunk", str(spec["chunk"])]
    if engine in ("threaded", "auto") and spec.get("workers"):
        argv += ["--workers", str(spec["workers"])]
    if engine == "ray" and spec.get("ray_workers"):
        argv += ["--ray_workers", str(spec["ray_workers"])]
    if spec.get("state_dtype"):
        argv += ["--state_dtype", spec["state_dtype"]]
    if spec.get("state_device"):
        argv += ["--state_device", spec["state_device"]]
    if spec.get("data_path"):
        argv += ["-data", spec["data_path"]]
    argv += variant
    args = main.parse_args(argv + list(spec.get("extra", [])))
    device = main.resolve_device(args)
    main.configure_backends(args, device)  # as main.run does
    if dataset is None:
        if spec.get("data_path"):
            dataset = load_federated_dataset(spec["data_path"], device, compact=args.compact_inputs)
        else:
            dataset = _synthetic_data(cfg, spec)
            if device.type != "cpu":
                _move_dataset(dataset, device)
    args.num_clients, args.num_classes = len(dataset.clients), dataset.num_classes
    seed_everything(derive_seed(args.seed, "init"))
    module = main.build_model(args, dataset, device)
    server = ALGORITHMS.get(args.algorithm)(args, dataset, module, device)
    return server, args, dataset


class _Run:
    """One server driven round by round with ``Server.train``'s loop body, timed per phase."""

    def __init__(self, server, args):
        self.server, self.args = server, args
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.eval_wall: list[float] = []
        self.samples: list[int] = []
        self.cohorts: list[int] = []
        self.trace: list[dict] = []

    def round(self, rnd: int) -> None:
        server, args = self.server, self.args
        wall0, cpu0 = time.perf_counter(), time.process_time()
        result = server.run_round(rnd, evaluate=rnd % args.eval_gap == 0)
        self.cohorts.append(len(result.cohort))
        evaluated = result.eval_seconds
        updates = result.updates
        self.wall.append(time.perf_counter() - wall0)
        self.cpu.append(time.process_time() - cpu0)
        self.eval_wall.append(evaluated)
        self.samples.append(sum(u.num_steps for u in updates) * int(args.batch_size))
        store = server.state
        self.trace.append({"round": rnd, "state_mb": store.nbytes() / 1024**2, "rss_mb": _current_rss_mb(),
                           "clients_with_state": len({i for n in store.names() for i in store.indices(n)})})

    def finish(self, rounds: int) -> None:
        self.server.evaluate(rounds)  # the final evaluation Server.train does (not timed)

    def fill_state(self) -> None:
        """Give every client the per-client vectors some client has now, as after a long run in which
        every client has participated (``--fill-state``), so the timed rounds show the full memory."""
        store = self.server.state
        for name in store.names():
            owners = store.indices(name)
            if not owners:
                continue
            template = store.get(name, owners[0])
            for index in range(len(self.server.clients)):
                if not store.has(name, index):
                    store.set(name, index, template)

    def summary(self, warm: int) -> dict:
        import torch

        server = self.server
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        totals, evals, cpus = self.wall[warm:], self.eval_wall[warm:], self.cpu[warm:]
        trains = [t - e for t, e in zip(totals, evals)]
        samples = med(self.samples[warm:])
        store = server.state
        with_state = self.trace[-1]["clients_with_state"] if self.trace else 0
        model_bytes = server.global_params.numel() * server.global_params.element_size()
        engine = server.engine
        out = {
            "algorithm": self.args.algorithm, "device": str(server.device), "threads": torch.get_num_threads(),
            "clients": len(server.clients), "cohort": med(self.cohorts),
            "params": int(server.model.num_params), "model_mb": model_bytes / 1024**2,
            "timed_rounds": len(totals),
            "s_per_round": med(totals), "train_s_per_round": med(trains), "eval_s_per_round": med(evals),
            "cpu_s_per_round": med(cpus),
            "round_times": self.wall, "eval_times": self.eval_wall, "cpu_times": self.cpu,
            "samples_per_round": samples,
            "train_samples_per_s": samples / med(trains) if trains and med(trains) else None,
            "final_test_acc": server.history.test_acc[-1] if server.history.test_acc else None,
            "test_acc": server.history.test_acc,
            "state_bytes": store.nbytes(), "state_mb": store.nbytes() / 1024**2, "clients_with_state": with_state,
            "state_resident_mb": store.resident_nbytes() / 1024**2, "state_store": type(store).__name__,
            "state_bytes_per_client": store.nbytes() / with_state if with_state else 0,
            "state_trace": self.trace,
            "engine_stats": dict(getattr(engine, "stats", {})),
            "step_runner": getattr(getattr(engine, "runner", None), "name", None),
            "graphs_captured": getattr(getattr(engine, "runner", None), "captured", None),
            "precision": getattr(engine, "precision", "fp32"),
            "engine_fallback": engine.model_fallback_reason() if hasattr(engine, "model_fallback_reason") else None,
        }
        if hasattr(engine, "actor_peak_rss_mb"):  # the ray engine: the work and the state are in the actors
            out["startup_s"] = engine.startup_seconds
            out["workers_peak_rss_mb"] = engine.actor_peak_rss_mb()
            out["workers_state_mb"] = [b / 1024**2 for b in engine.actor_state_nbytes()]
        if with_state:
            out["state_mb_if_all_clients"] = out["state_bytes_per_client"] * len(server.clients) / 1024**2
        return out


class _BaselineRun(_Run):
    """``--engines pfllib``: PFLlib's FedAvg procedure (utils/pfllib_baseline.py) on the same data,
    initial model, seed and threads, timed like the engines."""

    def __init__(self, spec: dict):
        import main
        from flcore.registry import MODELS
        from utils.data_utils import load_config
        from utils.pfllib_baseline import PFLlibStyleFedAvg, memory_reader, npz_reader, npz_train_sizes
        from utils.seeding import derive_seed, seed_everything

        cfg = CONFIGS[spec["config"]]
        if cfg["algorithm"] != "FedAvg" or spec["device"] != "cpu":
            raise SystemExit(f"the pfllib baseline runs FedAvg on the CPU only, not {cfg['algorithm']} on {spec['device']}")
        rounds = spec["warmup"] + spec["rounds"]
        args = main.parse_args(["-algo", "FedAvg", "-m", "CNN", "-lbs", "10", "-ls", "1", "-lr", "0.005",
                                "-jr", str(cfg["join_ratio"]), "-gr", str(rounds), "--seed", str(spec["seed"])])
        args.eval_gap = cfg["eval_gap"] or spec.get("eval_gap") or rounds + 1
        if spec.get("data_path"):  # files: read afresh whenever a client needs its data, as PFLlib
            folder = Path(spec["data_path"])
            config = load_config(folder, str(folder))
            num_classes, sizes = int(config["num_classes"]), npz_train_sizes(folder, int(config["num_clients"]))
            shape = config.get("input_shape") or list(npz_reader(folder)(0, "train")[0].shape[1:])
            reader = npz_reader(folder)
        else:
            dataset = _synthetic_data(cfg, spec)
            num_classes, sizes, shape = dataset.num_classes, [c.num_train for c in dataset.clients], dataset.input_shape
            reader = memory_reader(dataset)
        seed_everything(derive_seed(args.seed, "init"))  # the engines' initial model
        module = MODELS.get(args.model)(tuple(shape), num_classes, args)
        self.baseline = PFLlibStyleFedAvg(reader, sizes, num_classes, module, batch_size=args.batch_size, lr=args.local_learning_rate,
                                          local_epochs=args.local_epochs, join_ratio=args.join_ratio, seed=args.seed)
        super().__init__(None, args)

    def round(self, rnd: int) -> None:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self.baseline.send_models()
        evaluated = 0.0
        if rnd % self.args.eval_gap == 0:  # timed apart from training, as the engines' evaluation is
            eval0 = time.perf_counter()
            self.baseline.evaluate()
            evaluated = time.perf_counter() - eval0
        self.baseline.train_round()
        self.wall.append(time.perf_counter() - wall0)
        self.cpu.append(time.process_time() - cpu0)
        self.eval_wall.append(evaluated)
        self.cohorts.append(self.baseline.num_join)
        self.samples.append(self.baseline.last_steps * int(self.args.batch_size))
        self.trace.append({"round": rnd, "state_mb": 0.0, "rss_mb": _current_rss_mb(), "clients_with_state": 0})

    def finish(self, rounds: int) -> None:
        self.baseline.send_models()
        self.baseline.evaluate()

    def fill_state(self) -> None:
        """PFLlib's FedAvg has no per-client state."""

    def summary(self, warm: int) -> dict:
        import torch

        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        totals, evals = self.wall[warm:], self.eval_wall[warm:]
        trains = [t - e for t, e in zip(totals, evals)]
        samples = med(self.samples[warm:])
        params = sum(p.numel() for p in self.baseline.global_model.parameters())
        return {
            "algorithm": "FedAvg (PFLlib procedure)", "device": "cpu", "threads": torch.get_num_threads(),
            "clients": self.baseline.num_clients, "cohort": med(self.cohorts), "params": params,
            "model_mb": params * 4 / 1024**2, "timed_rounds": len(totals),
            "s_per_round": med(totals), "train_s_per_round": med(trains), "eval_s_per_round": med(evals),
            "cpu_s_per_round": med(self.cpu[warm:]),
            "round_times": self.wall, "eval_times": self.eval_wall, "cpu_times": self.cpu,
            "samples_per_round": samples, "train_samples_per_s": samples / med(trains) if trains and med(trains) else None,
            "final_test_acc": self.baseline.test_acc[-1] if self.baseline.test_acc else None,
            "test_acc": self.baseline.test_acc, "state_bytes": 0, "state_mb": 0.0, "clients_with_state": 0,
            "state_bytes_per_client": 0, "state_trace": self.trace, "engine_stats": {}, "engine_fallback": None,
        }


def run_worker(spec: dict) -> dict:
    """Train warm-up + timed rounds of one configuration for each engine in ``spec["engines"]``.

    With one engine the process's peak memory is that engine's; with several (``--interleave``)
    the servers take turns round by round, so a changing load on a shared machine affects every
    engine alike and the time ratios stay meaningful (the peak memory is then the sum)."""
    import torch

    from utils.mem_utils import peak_gpu_mb, peak_rss_mb

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    rounds = spec["warmup"] + spec["rounds"]
    runs: dict[str, _Run] = {}
    dataset = None
    rss_before = {}
    for engine in spec["engines"]:
        if engine == BASELINE:
            runs[engine] = _BaselineRun(spec)
        else:
            server, args, dataset = _build_server(spec, engine, dataset)
            runs[engine] = _Run(server, args)
        rss_before[engine] = _current_rss_mb()
    device = torch.device(spec["device"] if spec["device"] == "cpu" or torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    for rnd in range(rounds):
        for run in runs.values():
            run.round(rnd)
            if spec.get("fill_state") and rnd == spec["warmup"] - 1:
                run.fill_state()
    for run in runs.values():
        run.finish(rounds)
    wall = time.perf_counter() - started
    results = []
    for engine, run in runs.items():
        result = {"config": spec["config"], "engine": engine, "interleaved": len(runs) > 1,
                  "warmup_rounds": spec["warmup"], **run.summary(spec["warmup"]),
                  "peak_rss_mb": peak_rss_mb(), "rss_before_train_mb": rss_before[engine], "wall_s": wall}
        gpu = peak_gpu_mb(device)
        if gpu is not None:
            result["peak_gpu_mb"] = gpu
        results.append(result)
    return {"results": results}


# ---------------------------------------------------------------------------- PFLlib's own run
#: PFLlib's FedAvg flags for P1, the same as ours (README set-up); ``-gr`` and ``-dev`` are added
PFLLIB_P1_FLAGS = ["-data", "MNIST", "-m", "CNN", "-algo", "FedAvg", "-nc", "20", "-ncl", "10", "-lbs", "10",
                   "-ls", "1", "-lr", "0.005", "-jr", "1", "-eg", "1", "-did", "0"]
#: stand-ins for imports PFLlib's main.py makes but P1 never uses (FedPAC's solver; a memory pretty-printer)
PFLLIB_STUBS = {"cvxpy": "# stand-in: only PFLlib's FedPAC uses cvxpy\n",
                "torchvision": "# stand-in: PFLlib's main.py uses torchvision only for models P1 does not build\n",
                "calmsize": "def size(num_bytes):  # stand-in for calmsize.size (memory printing only)\n"
                            "    return float(num_bytes)\n"}


def _module_missing(name: str, python: str | None = None) -> bool:
    """Whether ``name`` cannot be imported by this interpreter (or by the interpreter ``python``)."""
    import importlib.util

    if python is None:  # (a venv's python links to its base interpreter: only the path tells venvs apart)
        return importlib.util.find_spec(name) is None
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode != 0


def pfllib_commit(pfllib: Path) -> str | None:
    """The short commit of ``pfllib`` when that folder is itself a git checkout (not a copy inside
    another repository), else None."""
    try:
        top = subprocess.run(["git", "-C", str(pfllib), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode == 0 and Path(top.stdout.strip()).resolve() == pfllib.resolve():
            return subprocess.run(["git", "-C", str(pfllib), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip() or None
    except OSError:
        pass
    return None


def write_pfllib_partition(data_folder: Path, target: Path) -> int:
    """Our partition in ``data_folder`` written in PFLlib's file format under ``target``
    (``train/<i>.npz`` and ``test/<i>.npz``, each an archive of one ``data`` dict of x and y), so that
    PFLlib trains on exactly our clients' data; nothing of PFLlib's is read here. Returns the number
    of clients."""
    import numpy as np

    config = json.loads((data_folder / "config.json").read_text())
    clients = int(config.get("num_clients", 20))
    for split in ("train", "test"):
        (target / split).mkdir(parents=True)
        for index in range(clients):
            with np.load(data_folder / split / f"{index}.npz", allow_pickle=False) as archive:
                x, y = np.asarray(archive["x"], dtype=np.float32), np.asarray(archive["y"], dtype=np.int64)
            np.savez_compressed(target / split / f"{index}.npz", data={"x": x, "y": y})
    return clients


def pfllib_workspace(pfllib: Path, data_folder: Path, root: Path, dataset: str = "MNIST",
                     python: str | None = None) -> dict[str, str]:
    """A runnable copy of PFLlib in ``root``: ``root/system`` (its code), ``root/dataset/<dataset>``
    (our partition in its format) and ``root/stubs`` (stand-ins for the imports of
    :data:`PFLLIB_STUBS` that ``python``, default this interpreter, lacks). Returns the environment
    to run its ``main.py`` with, from ``root/system``."""
    import shutil

    shutil.copytree(pfllib / "system", root / "system", ignore=shutil.ignore_patterns("__pycache__"))
    stubs = root / "stubs"
    stubs.mkdir()
    for module, text in PFLLIB_STUBS.items():
        if _module_missing(module, python):
            (stubs / f"{module}.py").write_text(text)
    write_pfllib_partition(data_folder, root / "dataset" / dataset)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(stubs), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def parse_pfllib_stdout(stdout: str) -> tuple[list[float], list[float]]:
    """(seconds of each round, test accuracy of each evaluation) from what PFLlib's ``main.py``
    prints: its per-round line is '-' * 25, 'time cost', '-' * 25, seconds (FD, FedProto, FedPCL,
    FedPAC and APPLE print '-' * 50, seconds; the summary's "Average time cost" is neither), and
    every evaluation prints "Averaged Test Accuracy: 0.xxxx"."""
    times = []
    for line in stdout.splitlines():
        words = line.split()
        if line.startswith("-" * 25) and words[-1].replace(".", "", 1).isdigit() and (
                "time cost" in line or len(words) == 2):
            times.append(float(words[-1]))
    accs = [float(line.split(":")[-1]) for line in stdout.splitlines() if line.startswith("Averaged Test Accuracy")]
    return times, accs


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished child processes so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pfllib_own_run(pfllib: Path, data_folder: Path | None, device: str, rounds: int, warmup: int,
                   timeout: int, threads: int = 0) -> dict:
    """PFLlib's own ``main.py`` on P1's partition with P1's flags; its per-round times (stdout's
    'time cost' lines, which include its evaluation as ours do) after ``warmup`` rounds.
    ``threads`` > 0 runs it with ``OMP_NUM_THREADS`` = ``threads`` (PFLlib sets no thread count of
    its own; on a loaded machine its default two threads wait for each other at every operation:
    on 2026-11-26 three rounds did not finish in 2,400 s, against 418 s a round on one thread).

    Runs in a temporary copy of ``pfllib/system`` whose ``../dataset/MNIST`` holds our P1
    partition written in PFLlib's file format (:func:`pfllib_workspace`), so PFLlib trains on
    exactly our clients' data."""
    import tempfile

    result: dict = {"config": "P1", "engine": "PFLlib main.py", "pfllib_dir": str(pfllib)}
    if not (pfllib / "system" / "main.py").is_file():
        return result | {"error": f"--pfllib {pfllib}: no system/main.py there (give a PFLlib checkout)"}
    if data_folder is None:
        return result | {"error": "P1 has no real MNIST partition here (see --mnist-raw), so PFLlib cannot run it"}
    result["pfllib_commit"] = pfllib_commit(pfllib)
    with tempfile.TemporaryDirectory(prefix="pfllib-run-") as tmp:
        root = Path(tmp)
        env = pfllib_workspace(pfllib, data_folder, root)
        if threads > 0:
            env["OMP_NUM_THREADS"] = str(threads)
            result["threads"] = threads
        argv = [sys.executable, "main.py", *PFLLIB_P1_FLAGS, "-gr", str(warmup + rounds - 1), "-dev", device]
        started, children_cpu, result["load_avg_before"] = time.perf_counter(), _children_cpu_s(), os.getloadavg()
        try:
            done = subprocess.run(argv, cwd=root / "system", capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return result | {"error": f"PFLlib's main.py timed out after {timeout} s"}
        result["wall_s"] = time.perf_counter() - started
        result["load_avg_after"] = os.getloadavg()
        # its CPU seconds (all threads), start-up and data loading included: a load-independent figure
        result["cpu_s_total"] = _children_cpu_s() - children_cpu
        result["cpu_s_per_round"] = result["cpu_s_total"] / (warmup + rounds)
    times, accs = parse_pfllib_stdout(done.stdout)
    if done.returncode != 0 or len(times) <= warmup:
        tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        return result | {"error": f"PFLlib's main.py exit {done.returncode}: {tail}"}
    timed = times[warmup:]
    return result | {"round_times": times, "s_per_round": statistics.median(timed), "timed_rounds": len(timed),
                     "final_test_acc": accs[-1] if accs else None, "argv": argv[1:]}


def pfllib_lines(own: dict, results: list[dict]) -> list[str]:
    """The speed-up of each of our P1 runs over PFLlib's own run on the same machine."""
    if "error" in own:
        return [f"  P1 PFLlib's own main.py: {own['error']}"]
    threads = f", OMP_NUM_THREADS={own['threads']}" if own.get("threads") else ""
    lines = [f"  P1 PFLlib's own main.py ({own.get('pfllib_commit') or own['pfllib_dir']}{threads}): {own['s_per_round']:.2f} s/round "
             f"(median of {own['timed_rounds']}; rounds " + ", ".join(f"{t:.2f}" for t in own["round_times"]) + ")"]
    if own.get("cpu_s_per_round") is not None:
        lines.append(f"  P1 PFLlib's own main.py: {own['cpu_s_per_round']:.2f} CPU s/round (its whole run's CPU seconds, "
                     f"start-up included, over its {len(own['round_times'])} rounds); "
                     f"load {_fmt(own['load_avg_before'][0], '.1f')} before, {_fmt(own['load_avg_after'][0], '.1f')} after")
    for r in results:
        if r["config"] == "P1" and "error" not in r and r.get("s_per_round") and not r.get("interleaved"):
            line = (f"  P1 {r['engine']} vs PFLlib's own main.py: speed-up {own['s_per_round'] / r['s_per_round']:.2f}x "
                    f"per round ({r['s_per_round']:.3f} vs {own['s_per_round']:.2f} s)")
            if own.get("cpu_s_per_round") and r.get("cpu_s_per_round"):
                line += (f", {own['cpu_s_per_round'] / r['cpu_s_per_round']:.2f}x in CPU seconds "
                         f"({r['cpu_s_per_round']:.2f} vs {own['cpu_s_per_round']:.2f})")
            lines.append(line)
    return lines


# ---------------------------------------------------------------------------- driver
def device_name(device: str) -> str:
    if device == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                return f"{torch.cuda.get_device_name(0)} (CUDA)"
        except Exception:  # noqa: BLE001
            pass
        return "cuda requested, no GPU visible (cpu)"
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs"


def _fmt(value, spec=".2f", none="-") -> str:
    return none if value is None else format(value, spec)


def _ratio_lines(results: list[dict], names: list[str], interleaved: bool) -> list[str]:
    by = {(r["config"], r["engine"]): r for r in results if "error" not in r and r.get("interleaved", False) == interleaved}
    lines = []
    tag = "interleaved" if interleaved else "separate runs"
    present = list(dict.fromkeys(r["engine"] for r in results))
    ours = [e for e in present if e not in ("sequential", BASELINE)]
    for name in names:
        seq = by.get((name, "sequential"))
        for engine in ours:
            other = by.get((name, engine))
            if not (seq and other and seq["s_per_round"] and other["s_per_round"]):
                continue
            line = (f"  {name} {engine}/sequential ({tag}): s/round {other['s_per_round'] / seq['s_per_round']:.2f} "
                    f"(speed-up {seq['s_per_round'] / other['s_per_round']:.2f}x), training "
                    f"{other['train_s_per_round'] / seq['train_s_per_round']:.2f} "
                    f"(speed-up {seq['train_s_per_round'] / other['train_s_per_round']:.2f}x), CPU s/round "
                    f"{other['cpu_s_per_round'] / seq['cpu_s_per_round']:.2f}")
            if not interleaved:
                line += f", peak RSS {other['peak_rss_mb'] / seq['peak_rss_mb']:.2f}"
            if seq.get("final_test_acc") is not None and other.get("final_test_acc") is not None:
                line += f", final accuracy {100 * (other['final_test_acc'] - seq['final_test_acc']):+.2f} points"
            lines.append(line)
        base = by.get((name, BASELINE))
        for engine in [e for e in present if e != BASELINE]:
            other = by.get((name, engine))
            if not (base and other and base["s_per_round"] and other["s_per_round"]):
                continue
            line = (f"  {name} {engine} vs PFLlib's procedure ({tag}): speed-up {base['s_per_round'] / other['s_per_round']:.2f}x "
                    f"per round, {base['train_s_per_round'] / other['train_s_per_round']:.2f}x training")
            if base["eval_s_per_round"] and other["eval_s_per_round"]:
                line += f", {base['eval_s_per_round'] / other['eval_s_per_round']:.2f}x evaluation"
            if not interleaved:
                line += f", peak RSS {other['peak_rss_mb']:.0f} vs {base['peak_rss_mb']:.0f} MB"
            if base.get("final_test_acc") is not None and other.get("final_test_acc") is not None:
                line += f", final accuracy {100 * (other['final_test_acc'] - base['final_test_acc']):+.2f} points"
            lines.append(line)
        if name == "P1" and not interleaved and not base:
            lines.append(f"  P1: add '{BASELINE}' to --engines for the speed-up over PFLlib's procedure in the same run "
                         "(figures from another day do not compare on a shared machine)")
    return lines


def print_table(results: list[dict], device: str, notes: dict[str, str]) -> None:
    print(f"\ndevice: {device_name(device)}")
    for name, note in notes.items():
        print(f"  {name}: {CONFIGS[name]['title']}  [{note}]")
    head = (f"{'cfg':4} {'engine':10} {'mode':5} {'s/round':>8} {'train s':>8} {'eval s':>7} {'CPU s':>7} "
            f"{'samples/s':>9} {'peak RSS MB':>11} {'GPU MB':>7} {'state MB':>8} {'acc':>6} {'thr':>3} {'load':>5}")
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['config']:4} {r['engine']:10} failed: {r['error']}")
            continue
        mode = "inter" if r.get("interleaved") else "sep"
        rss = "(sum)" if r.get("interleaved") else _fmt(r["peak_rss_mb"], "11.0f")
        load = r.get("load_avg_before", [None])[0]
        print(f"{r['config']:4} {r['engine']:10} {mode:5} {_fmt(r['s_per_round'], '8.2f')} {_fmt(r['train_s_per_round'], '8.2f')} "
              f"{_fmt(r['eval_s_per_round'], '7.2f')} {_fmt(r['cpu_s_per_round'], '7.2f')} "
              f"{_fmt(r['train_samples_per_s'], '9.0f')} {rss:>11} {_fmt(r.get('peak_gpu_mb'), '7.0f')} "
              f"{_fmt(r['state_mb'], '8.1f')} {_fmt(r['final_test_acc'], '6.4f')} {r['threads']:3d} {_fmt(load, '5.1f')}")
    lines = _ratio_lines(results, list(notes), False) + _ratio_lines(results, list(notes), True)
    if lines:
        print("ratios (batched/sequential: < 1 means the batched engine is faster; speed-ups: > 1 means ours is faster):")
        print("\n".join(lines))
    for r in results:
        if r.get("startup_s") is not None and not r.get("interleaved"):
            print(f"  {r['config']} ray: start-up {r['startup_s']:.1f} s (Ray instance and actors, in the warm-up "
                  f"round); actors' peak RSS " + ", ".join(f"{m:.0f}" for m in r["workers_peak_rss_mb"])
                  + " MB; actors' state " + ", ".join(f"{m:.1f}" for m in r["workers_state_mb"]) + " MB")
    for r in results:
        if r.get("state_trace") and r.get("clients_with_state") and not r.get("interleaved"):
            where = " on disk" if r.get("state_store") == "DiskStateStore" else ""
            print(f"  {r['config']} {r['engine']}: state {r['state_mb']:.1f} MB{where} for {r['clients_with_state']} clients "
                  f"({r['state_bytes_per_client'] / 1024**2:.2f} MB each; all {r['clients']}: "
                  f"{r.get('state_mb_if_all_clients', 0):.0f} MB); model {r['model_mb']:.2f} MB; "
                  "after each round: state " + ", ".join(f"{t['state_mb']:.0f}" for t in r["state_trace"])
                  + " MB, RSS " + ", ".join(f"{t['rss_mb']:.0f}" for t in r["state_trace"]) + " MB")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per configuration (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up + 2 timed rounds")
    p.add_argument("--only", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), metavar="CFG",
                   help="configurations to run (P1 P2 P3)")
    p.add_argument("--engines", nargs="+", default=["sequential", "batched"],
                   help=f"engines to compare (sequential, batched, auto; {BASELINE}: PFLlib's FedAvg procedure "
                        "re-implemented, the same-run baseline, P1/P2 on the CPU only)")
    p.add_argument("--chunk", type=int, default=0, help="--cohort_chunk of the batched engines (0 = whole cohort)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads in each run (0 = torch's default)")
    p.add_argument("--workers", type=int, default=0, help="--workers of the threaded/auto engines (0 = one per core)")
    p.add_argument("--ray-workers", type=int, default=0, help="--ray_workers of the ray engine (0 = one per core)")
    p.add_argument("--state-dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="--state_dtype of the runs (per-client state storage; P3)")
    p.add_argument("--state-device", default=None, choices=["auto", "cpu", "disk"],
                   help="--state_device of the runs (disk: per-client state in files, P3)")
    p.add_argument("--fill-state", action="store_true",
                   help="after the warm-up, give every client the state vectors (P3: SCAFFOLD's control variate) "
                        "as after a long run, so the timed rounds show the memory of the full state")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=REPO / "dataset" / "benchmark",
                   help="where P1's generated MNIST folder is kept")
    p.add_argument("--mnist-raw", type=Path, default=REPO.parent / "shared" / "data" / "MNIST" / "raw",
                   help="MNIST IDX files for generate_MNIST.py --raw-dir")
    p.add_argument("--synthetic-mnist", action="store_true", help="use random MNIST-shaped data for P1")
    p.add_argument("--p2-data", type=str, default=None,
                   help="dataset folder for P2/P3 (e.g. CIFAR-10 with 1000 clients); default random tensors")
    p.add_argument("--p2-clients", type=int, default=1000,
                   help="clients of the synthetic P2/P3 data (the issue's 1000; fewer for a smoke run)")
    p.add_argument("--p2-eval-gap", type=int, default=0,
                   help="evaluate P2/P3 every N rounds (0 = only outside the timed rounds)")
    p.add_argument("--interleave", action="store_true",
                   help="also run the engines in one process taking turns round by round (time ratios that a "
                        "changing load on a shared machine cannot bias; the peak memory is then shared)")
    p.add_argument("--interleave-only", action="store_true", help="only the interleaved runs (no memory figures)")
    p.add_argument("--precision", default="fp32", choices=list(PRECISION_VARIANTS),
                   help="--precision of our runs (an --engines entry's +bf16 etc. overrides it)")
    p.add_argument("--pfllib", type=Path, default=None, metavar="DIR",
                   help="a PFLlib checkout: also run its own main.py on P1's partition (same flags, after ours) "
                        "and print our speed-up over it")
    p.add_argument("--pfllib-rounds", type=int, default=None,
                   help="timed rounds of PFLlib's own run (default --rounds)")
    p.add_argument("--pfllib-threads", type=int, default=0,
                   help="OMP_NUM_THREADS of PFLlib's own run (0 = its default, one per core; 1 is fair on a "
                        "loaded machine, where the CPU-second ratio is the figure to read)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds allowed per (configuration, engine) run")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default results/benchmark-<timestamp>.json)")
    p.add_argument("--worker", type=str, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 2, 1
    if args.pfllib is not None and args.warmup + (args.pfllib_rounds or args.rounds) < 2:
        # PFLlib's -gr N runs rounds 0..N, so one round would be -gr 0, which its summary divides by
        print("error: --pfllib needs --warmup + --pfllib-rounds (or --rounds) of at least 2 "
              "(PFLlib cannot run a single round); e.g. --warmup 1 --rounds 1", file=sys.stderr)
        raise SystemExit(2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker is not None:
        print("BENCHMARK-RESULT " + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    notes: dict[str, str] = {}
    data_paths: dict[str, str | None] = {}
    for name in args.only:
        if CONFIGS[name]["data"] == "mnist":
            folder, note = (None, "synthetic (--synthetic-mnist)") if args.synthetic_mnist else prepare_mnist(
                args.data_dir, args.mnist_raw)
            data_paths[name] = str(folder) if folder else None
        else:
            data_paths[name] = args.p2_data
            note = f"data {args.p2_data}" if args.p2_data else "synthetic CIFAR-10-shaped tensors (no CIFAR-10 here)"
            if not args.p2_data and args.p2_clients != 1000:
                note += f", {args.p2_clients} clients"
        notes[name] = note
    jobs: list[tuple[str, list[str]]] = []
    for name in args.only:
        if not args.interleave_only:
            jobs += [(name, [engine]) for engine in args.engines]
        if (args.interleave or args.interleave_only) and len(args.engines) > 1:
            jobs.append((name, list(args.engines)))
    results = []
    for name, engines in jobs:
        spec = {"config": name, "engines": engines, "device": args.device, "rounds": args.rounds,
                "warmup": args.warmup, "seed": args.seed, "chunk": args.chunk, "threads": args.threads,
                "workers": args.workers, "ray_workers": args.ray_workers, "state_dtype": args.state_dtype, "fill_state": args.fill_state,
                "state_device": args.state_device, "p2_clients": args.p2_clients,
                "data_path": data_paths[name], "eval_gap": args.p2_eval_gap or None, "precision": args.precision}
        load_before = os.getloadavg()
        print(f"running {name} with {' and '.join(engines)}{' interleaved' if len(engines) > 1 else ''} ...",
              file=sys.stderr, flush=True)
        try:
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                                  cwd=HERE, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("BENCHMARK-RESULT ")]
            if done.returncode != 0 or not lines:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                got = [{"config": name, "engine": e, "error": f"exit {done.returncode}: {tail}"} for e in engines]
            else:
                got = json.loads(lines[-1][len("BENCHMARK-RESULT "):])["results"]
        except subprocess.TimeoutExpired:
            got = [{"config": name, "engine": e, "error": f"timed out after {args.timeout} s"} for e in engines]
        for result in got:
            result["load_avg_before"], result["load_avg_after"] = load_before, os.getloadavg()
            result["data"] = notes[name]
            results.append(result)
    own = None
    if args.pfllib is not None and "P1" in args.only:
        print("running PFLlib's own main.py on P1 ...", file=sys.stderr, flush=True)
        own = pfllib_own_run(args.pfllib.resolve(), Path(data_paths["P1"]) if data_paths.get("P1") else None,
                             args.device, args.pfllib_rounds or args.rounds, args.warmup, args.timeout,
                             args.pfllib_threads)
    print_table(results, args.device, notes)
    if own is not None:
        print("\n".join(pfllib_lines(own, results)))
    out = args.out or REPO / "results" / f"benchmark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": device_name(args.device), "host": platform.node(),
        "python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
        "argv": sys.argv[1:], "rounds": args.rounds, "warmup": args.warmup, "pfllib_p1_reference": PFLLIB_P1,
        "configs": {k: CONFIGS[k] | {"data": notes[k]} for k in args.only},
        "pfllib_own_run": own,
    }
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    print(f"written: {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
