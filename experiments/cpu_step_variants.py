"""CPU seconds of one P1 training step (CNN, B=10) and one evaluation batch, per variant.

Every variant runs on one intra-op thread in this one process, interleaved round-robin (``--reps``
passes over the variants, each timing ``--steps`` steps), so a changing load on the shared machine
hits every variant alike. Times are process CPU seconds (``time.process_time``) per step, median
over the passes; compile time is reported apart. Run from the repository root::

    nice -n 10 .venv/bin/python experiments/cpu_step_variants.py --part train
    nice -n 10 .venv/bin/python experiments/cpu_step_variants.py --part eval
    nice -n 10 .venv/bin/python experiments/cpu_step_variants.py --part batched
    nice -n 10 .venv/bin/python experiments/cpu_step_variants.py --part evaluation --reps 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "system"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flcore.trainmodel.models  # noqa: E402,F401  (registers the CNN)
from flcore.flat import FlatModel  # noqa: E402
from flcore.registry import MODELS  # noqa: E402
from flcore.trainmodel.layout import use_channels_last  # noqa: E402


def cnn(channels_last: bool = True) -> FlatModel:
    torch.manual_seed(0)
    module = MODELS.get("CNN")((1, 28, 28), 10, None)
    if channels_last:
        use_channels_last(module)
    return FlatModel(module)


def data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def cpu_per_call(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def interleave(variants: dict, calls: int, reps: int) -> dict[str, float]:
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(cpu_per_call(fn, calls))
    return {name: statistics.median(ts) for name, ts in times.items()}


def report(title: str, medians: dict[str, float], unit: str, compile_s: dict[str, float]) -> None:
    base = next(iter(medians.values()))
    print(f"\n{title} (one thread, CPU {unit}, median; load {os.getloadavg()[0]:.1f})")
    for name, t in medians.items():
        extra = f"  compile {compile_s[name]:.1f} CPU s" if name in compile_s else ""
        print(f"  {name:32s} {t * 1e3:8.3f} ms   {base / t:5.2f}x{extra}")


# ------------------------------------------------------------------- training step
def train_part(args) -> None:
    x_all, y_all = data(6400)
    lr = 0.005
    batches = [(x_all[i:i + 10], y_all[i:i + 10]) for i in range(0, 6400, 10)]
    variants, compile_s, models, forwards = {}, {}, {}, {}

    def implicit_bf16(on: bool) -> None:
        """oneDNN's fp32 convolutions and matrix products with bf16 inputs inside the kernel
        (``fp32_precision = "bf16"``, as TF32 on a GPU): no cast operations, fp32 everywhere else."""
        value = "bf16" if on else "none"
        torch.backends.mkldnn.conv.fp32_precision = value
        torch.backends.mkldnn.matmul.fp32_precision = value

    def stepper(model: FlatModel, forward, autocast: bool = False, bf32: bool = False):
        cursor = [0]

        def step():
            implicit_bf16(bf32)
            x, y = batches[cursor[0] % len(batches)]
            cursor[0] += 1
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast, cache_enabled=False):
                loss = F.cross_entropy(forward(x), y)
            loss.backward()
            model.params.add_(model.grad, alpha=-lr)
        return step

    for name in args.variants:
        model = cnn(channels_last="nchw" not in name)
        model.module.train()
        if "poolfirst" in name:  # max-pool before ReLU: the same numbers (both monotone), ReLU on 1/4 of the values
            body = model.module.body
            body[1], body[2], body[4], body[5] = body[2], body[1], body[5], body[4]
        models[name] = model
        forward = model.module
        bf16 = "bf16" in name
        if name.startswith("compile"):
            mode = "max-autotune-no-cudagraphs" if "autotune" in name else None
            if "poolbreak" in name:  # inductor's max-pool-with-indices kernel was the slow part
                for sub in model.module.modules():
                    if isinstance(sub, torch.nn.MaxPool2d):
                        sub.forward = torch.compiler.disable(sub.forward)
            forward = torch.compile(model.module, mode=mode, dynamic=False)
        forwards[name] = forward
        step = stepper(model, forward, bf16, "bf32" in name)
        t0 = time.process_time()
        step()
        step()
        compile_s[name] = time.process_time() - t0
        variants[name] = step
    # the same updates? restart every model from the same vector and take 20 steps each
    ref = None
    for name, model in models.items():
        implicit_bf16("bf32" in name)
        model.load(cnn().vector)
        for x, y in batches[:20]:
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled="bf16" in name, cache_enabled=False):
                loss = F.cross_entropy(forwards[name](x), y)
            loss.backward()
            model.params.add_(model.grad, alpha=-lr)
        if ref is None:
            ref = model.vector.clone()
        print(f"{name}: max |w - w_eager| after 20 steps = {(model.vector - ref).abs().max().item():.2e}")
    implicit_bf16(False)
    medians = interleave(variants, args.steps, args.reps)
    implicit_bf16(False)
    report("P1 training step, B=10", medians, "ms per step", {k: v for k, v in compile_s.items() if k.startswith("compile")})


# ------------------------------------------------------------------- evaluation batch
def eval_part(args) -> None:
    bs = args.eval_batch
    x_all, _ = data(bs * 8)
    chunks = [x_all[i:i + bs] for i in range(0, len(x_all), bs)]
    model = cnn()
    module = model.module.eval()
    variants, compile_s, outputs = {}, {}, {}

    def runner(fwd, convert=lambda t: t):
        cursor = [0]

        def run():
            x = chunks[cursor[0] % len(chunks)]
            cursor[0] += 1
            with torch.no_grad():
                return fwd(convert(x))
        return run

    for name in args.eval_variants:
        t0 = time.process_time()
        if name == "eager":
            fwd = module
        elif name == "eager-nchw":
            plain = cnn(channels_last=False).module.eval()
            plain.load_state_dict(module.state_dict())
            fwd = plain
        elif name == "compile":
            fwd = torch.compile(module, dynamic=False)
        elif name == "compile-freeze":
            import torch._inductor.config as cfg
            cfg.freezing = True
            fresh = cnn().module.eval()
            fresh.load_state_dict(module.state_dict())
            fwd = torch.compile(fresh, dynamic=False)
        elif name.startswith("jit-freeze"):
            plain = cnn(channels_last="cl" in name).module.eval()
            plain.load_state_dict(module.state_dict())
            with torch.no_grad():
                fwd = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(plain, chunks[0])))
        elif name == "mkldnn":
            from torch.utils import mkldnn as mk
            plain = cnn(channels_last=False).module.eval()
            plain.load_state_dict(module.state_dict())
            packed = mk.to_mkldnn(plain)
            fwd = lambda x: packed(x.to_mkldnn()).to_dense()  # noqa: E731
        else:
            raise SystemExit(f"unknown eval variant {name}")
        run = runner(fwd)
        outputs[name] = run()
        run()
        compile_s[name] = time.process_time() - t0
        variants[name] = run
    ref = outputs[args.eval_variants[0]]
    for name, out in outputs.items():
        print(f"{name}: max |logit - eager| = {(out - ref).abs().max().item():.2e}")
    medians = interleave(variants, args.steps // 4 or 1, args.reps)
    report(f"P1 evaluation batch of {bs}", medians, "ms per batch", {k: v for k, v in compile_s.items() if k != "eager"})
    print("  rows/s:", {k: round(bs / v) for k, v in medians.items()})


# ------------------------------------------------------------------- batched over clients
def _conv_bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """K clients' convolutions as one batched matrix product: x [K, B, C, H, W], w [K, O, C, k, k]."""
    K, B, C, H, W = x.shape
    O, k = w.shape[1], w.shape[-1]
    cols = F.unfold(x.reshape(K * B, C, H, W), k)                       # [K*B, C*k*k, L]
    L = cols.shape[-1]
    cols = cols.view(K, B, C * k * k, L).transpose(1, 2).reshape(K, C * k * k, B * L)
    out = torch.baddbmm(b.unsqueeze(-1), w.reshape(K, O, C * k * k), cols)  # [K, O, B*L]
    side = H - k + 1
    return out.view(K, O, B, side, side).transpose(1, 2)                # [K, B, O, h, w] (a view)


def _cnn_stacked(params: dict, x: torch.Tensor) -> torch.Tensor:
    """P1's CNN for K clients at once, written with batched matrix products: x [K, B, 1, 28, 28]."""
    K, B = x.shape[:2]
    h = _conv_bmm(x, params["body.0.weight"], params["body.0.bias"])
    h = F.max_pool2d(F.relu(h.reshape(K * B, *h.shape[2:])), 2)
    h = _conv_bmm(h.view(K, B, *h.shape[1:]), params["body.3.weight"], params["body.3.bias"])
    h = F.max_pool2d(F.relu(h.reshape(K * B, *h.shape[2:])), 2).reshape(K, B, -1)
    h = F.relu(torch.baddbmm(params["body.7.bias"].unsqueeze(1), h, params["body.7.weight"].transpose(1, 2)))
    return torch.baddbmm(params["head.bias"].unsqueeze(1), h, params["head.weight"].transpose(1, 2))


def batched_part(args) -> None:
    from torch.func import functional_call, grad_and_value, vmap

    K, B, lr = args.clients, 10, 0.005
    x_all, y_all = data(K * B * 64)
    xs = x_all.view(64, K, B, 1, 28, 28)
    ys = y_all.view(64, K, B)
    flat = cnn(channels_last=False)
    names = [n for n, _ in flat.module.named_parameters()]
    start = {n: p.detach().clone() for n, p in flat.module.named_parameters()}

    def stacked():
        return {n: v.unsqueeze(0).repeat(K, *[1] * v.dim()).contiguous() for n, v in start.items()}

    # (1) what the batched engine does: vmap(grad) over the clients (grouped convolutions)
    vparams = stacked()

    def loss_one(params, x, y):
        return F.cross_entropy(functional_call(flat.module, params, (x,)), y)
    vstep_fn = vmap(grad_and_value(loss_one))
    cursor = {"v": 0, "b": 0, "s": 0}

    def vstep():
        i = cursor["v"] % 64
        cursor["v"] += 1
        grads, _ = vstep_fn(vparams, xs[i], ys[i])
        for n in names:
            vparams[n].sub_(grads[n], alpha=lr)

    # (2) the same step with batched matrix products
    bparams = {n: v.requires_grad_() for n, v in stacked().items()}

    def bstep():
        i = cursor["b"] % 64
        cursor["b"] += 1
        logits = _cnn_stacked(bparams, xs[i])
        loss = F.cross_entropy(logits.reshape(K * B, -1), ys[i].reshape(-1), reduction="sum") / B
        grads = torch.autograd.grad(loss, [bparams[n] for n in names])
        with torch.no_grad():
            for n, g in zip(names, grads):
                bparams[n].sub_(g, alpha=lr)

    # (3) reference: the K clients one after another (channels-last eager, as the threaded engine)
    seq = [cnn() for _ in range(K)]

    def sstep():
        i = cursor["s"] % 64
        cursor["s"] += 1
        for k, model in enumerate(seq):
            model.zero_grad()
            F.cross_entropy(model.module(xs[i, k]), ys[i, k]).backward()
            model.params.add_(model.grad, alpha=-lr)

    for fn in (vstep, bstep, sstep):
        fn()
    # equal updates after a few steps from the same start
    for n in names:
        vparams[n].copy_(stacked()[n])
        with torch.no_grad():
            bparams[n].copy_(stacked()[n])
    for model in seq:
        model.load(flat.vector)
    cursor.update(v=0, b=0, s=0)
    for _ in range(5):
        vstep(), bstep(), sstep()
    for n in names:
        ref = torch.stack([dict(m.module.named_parameters())[n].detach() for m in seq])
        print(f"{n}: |vmap - seq| {(vparams[n] - ref).abs().max():.1e}  |bmm - seq| {(bparams[n].detach() - ref).abs().max():.1e}")
    medians = interleave({"sequential (per client)": sstep, "vmap grouped conv": vstep, "unfold + bmm": bstep},
                         max(args.steps // K, 2), args.reps)
    report(f"P1 step of {K} clients, B=10 (time / {K} = per client-step)", {k: v / K for k, v in medians.items()},
           "ms per client-step", {})


# ------------------------------------------------------------------- a whole P1 evaluation
def evaluation_part(args) -> None:
    """``Server.evaluate_models`` of P1's global model over all 70,000 rows (test accuracy, AUC,
    train loss), ``--eval_frozen`` True and False, interleaved; one intra-op thread."""
    import main as entry
    from flcore.registry import ALGORITHMS
    from fldata.loading import load_federated_dataset

    servers = {}
    for frozen in (False, True):
        argv = ["-algo", "FedAvg", "-m", "CNN", "-data", args.data, "-dev", "cpu", "--engine", "sequential",
                "--progress", "False", "-q", "True", "--eval_frozen", str(frozen)]
        flags = entry.parse_args(argv)
        dataset = load_federated_dataset(args.data, torch.device("cpu"), compact=flags.compact_inputs)
        flags.num_clients, flags.num_classes = len(dataset.clients), dataset.num_classes
        torch.manual_seed(0)
        module = entry.build_model(flags, dataset, torch.device("cpu"))
        servers["frozen" if frozen else "eager"] = ALGORITHMS.get("FedAvg")(flags, dataset, module, torch.device("cpu"))
    params = servers["eager"].global_params.clone()
    results = {name: [] for name in servers}
    times = {name: [] for name in servers}
    for _ in range(args.reps):
        for name, server in servers.items():
            start = time.process_time()
            results[name].append(server.evaluate_models(lambda i: params))
            times[name].append(time.process_time() - start)
    for name in servers:
        r = results[name][-1]
        print(f"{name:7s} CPU s per evaluation {statistics.median(times[name]):6.2f} (all: "
              f"{', '.join(f'{t:.2f}' for t in times[name])})  acc {r.test_acc:.6f} auc {r.test_auc:.6f} "
              f"train loss {r.train_loss:.8f}")
    print(f"load {os.getloadavg()[0]:.1f}")


# ------------------------------------------------------------------- the platform's step vs a bare one
def client_part(args) -> None:
    """One P1 client's local round through ``Client.local_train`` (the sequential engine's path:
    plan, hooks, input decoding, flat update) against a bare loop of the same steps on the same
    model, interleaved: the platform's per-step overhead."""
    import main as entry
    from flcore.registry import ALGORITHMS
    from fldata.loading import decode_inputs, load_federated_dataset

    argv = ["-algo", "FedAvg", "-m", "CNN", "-data", args.data, "-dev", "cpu", "--engine", "sequential",
            "-lbs", "10", "-lr", "0.005", "--progress", "False", "-q", "True"]
    flags = entry.parse_args(argv)
    dataset = load_federated_dataset(args.data, torch.device("cpu"), compact=flags.compact_inputs)
    flags.num_clients, flags.num_classes = len(dataset.clients), dataset.num_classes
    torch.manual_seed(0)
    server = ALGORITHMS.get("FedAvg")(flags, dataset, entry.build_model(flags, dataset, torch.device("cpu")),
                                      torch.device("cpu"))
    client = server.clients[args.client]
    package = server.make_package(0, [args.client])
    model = server.model
    job = client.plan_job(package)
    plan = [idx for idx in job.plan][: args.steps]
    table = dataset.input_table
    rows = [(decode_inputs(client.data.train_x[idx], table), client.data.train_y[idx]) for idx in plan]

    def platform():
        client.local_train(model, package)

    def bare():
        model.load(package.global_params)
        model.module.train()
        for x, y in rows:
            model.zero_grad()
            F.cross_entropy(model.module(x), y).backward()
            model.params.add_(model.grad, alpha=-0.005)

    steps = len(job.plan)
    print(f"client {args.client}: {steps} steps per round (bare loop: the first {len(rows)})")
    times = {"platform (per step)": [], "bare loop (per step)": []}
    for _ in range(args.reps):
        start = time.process_time()
        platform()
        times["platform (per step)"].append((time.process_time() - start) / steps)
        start = time.process_time()
        bare()
        times["bare loop (per step)"].append((time.process_time() - start) / len(rows))
    report("P1 client round", {k: statistics.median(v) for k, v in times.items()}, "ms per step", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["train", "eval", "batched", "evaluation", "client"], default="train")
    parser.add_argument("--variants", nargs="+", default=["eager", "compile"])
    parser.add_argument("--eval-variants", nargs="+", default=["eager", "compile", "jit-freeze", "mkldnn"])
    parser.add_argument("--eval-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--client", type=int, default=0, help="--part client: which P1 client")
    parser.add_argument("--data", default="experiments/out/data/MNIST-dir0.1-20",
                        help="--part evaluation: P1's data folder")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    {"train": train_part, "eval": eval_part, "batched": batched_part, "evaluation": evaluation_part, "client": client_part}[args.part](args)


if __name__ == "__main__":
    main()
