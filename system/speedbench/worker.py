"""One (configuration, engine) run in its own process: the server built as ``main.py`` builds it, rounds
timed phase by phase, and PFLlib's FedAvg procedure re-implemented on the same data."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from speedbench.configs import BASELINE, CONFIGS
from speedbench.data import _move_dataset, _synthetic_data


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
    from fldata.loading import load_federated_dataset
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
    """``--engines pfllib``: PFLlib's FedAvg procedure (runner/pfllib_baseline.py) on the same data,
    initial model, seed and threads, timed like the engines."""

    def __init__(self, spec: dict):
        import main
        from flcore.registry import MODELS
        from fldata.loading import load_config
        from runner.pfllib_baseline import PFLlibStyleFedAvg, memory_reader, npz_reader, npz_train_sizes
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
