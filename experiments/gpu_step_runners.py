"""GPU diagnostics of the batched engine: per-step cost of the batched engine's step runners on a cohort of
equal clients (one row bucket; CNN, B=10), against the sequential engine's per-client step, and the
host syncs of one round per engine. Run from the repository root::

    python experiments/gpu_step_runners.py cuda                       # P1's shape: 20 clients, 1x28x28
    SB_CLIENTS=50 SB_SHAPE=3,32,32 SB_RUNNERS="eager graph" python experiments/gpu_step_runners.py cuda   # P2's

SB_SAMPLES (default 400) training rows per client, so SB_SAMPLES/10 steps a round. SB_CUDNN_BENCHMARK=1 turns
cuDNN's timed algorithm choice on (--cudnn_benchmark); SB_LAYOUT=nchw|channels_last sets --conv_layout;
SB_BATCHED_CONV=grouped|unfold|grouped_nhwc sets --batched_conv. SB_PROFILE=1 adds the GPU kernels of one round of the eager and the
captured batched step (torch.profiler, CUDA activity), the top ones by self time, and their sum per cohort step: where
that sum is close to the step's wall time the step is bound by its kernels, not by launches."""
import sys, time, warnings, os
sys.path[:0] = ["tests/system", "system", "."]
import torch
from fltest import make_args, image_dataset, load_all
from flcore.registry import ALGORITHMS, MODELS
from fldata.loading import ClientData, FederatedDataset

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
clients = int(os.environ.get("SB_CLIENTS", 20)); per = int(os.environ.get("SB_SAMPLES", 400))
runners = os.environ.get("SB_RUNNERS", "eager graph compiled").split()
load_all()
shape = tuple(int(v) for v in os.environ.get("SB_SHAPE", "1,28,28").split(","))
base = image_dataset([per] * clients, shape=shape, num_classes=10)
data = FederatedDataset(name=base.name, path=base.path, config=dict(base.config),
                        clients=[ClientData(c.cid, c.train_x.to(dev), c.train_y.to(dev), c.test_x.to(dev), c.test_y.to(dev)) for c in base.clients])

torch.backends.cudnn.benchmark = os.environ.get("SB_CUDNN_BENCHMARK", "0") == "1"
layout = os.environ.get("SB_LAYOUT", "auto")
batched_conv = os.environ.get("SB_BATCHED_CONV", "grouped")
print(f"cudnn.benchmark {torch.backends.cudnn.benchmark}, conv layout {layout}, batched conv {batched_conv}", flush=True)

def server(engine, **flags):
    if engine == "batched":
        flags.setdefault("batched_conv", batched_conv)
    args = make_args("FedAvg", engine=engine, batch_size=10, local_learning_rate=0.005, eval_auc=False,
                     conv_layout=layout, **flags)
    torch.manual_seed(0)
    return ALGORITHMS.get("FedAvg")(args, data, MODELS.get("CNN")(data.input_shape, 10, None).to(dev), dev)

def sync():
    if dev.type == "cuda": torch.cuda.synchronize()

def one_round(s, rnd):
    cohort = list(range(clients))
    sync(); t = time.perf_counter()
    out = s.engine.train([s.clients[i] for i in cohort], s.make_package(rnd, cohort))
    sync(); return time.perf_counter() - t, out

steps = per // 10
results = {}

def bench(runner):
    try:
        s = server("batched", step_runner=runner)
        first, ref = one_round(s, 0)
        times = [one_round(s, r)[0] for r in (1, 2)]
        best = min(times)
        results[runner] = ref
        print(f"batched step_runner={runner}: first round {first:.2f} s (capture/compile), then {best:.3f} s/round = "
              f"{1000 * best / steps:.3f} ms per cohort step ({clients} clients x B=10), graphs {getattr(s.engine.runner, 'captured', None)}", flush=True)
        if runner != "eager" and "eager" in results:
            d = max(float((a.params - b.params).abs().max()) for a, b in zip(ref, results["eager"]))
            print(f"  {runner} vs eager after round 0: max |diff| {d:.3g}", flush=True)
    except Exception as exc:
        print(f"batched step_runner={runner}: FAILED {type(exc).__name__}: {exc}"[:400], flush=True)

for runner in [r for r in runners if r != "compiled"]:
    bench(runner)
s = server("sequential")
one_round(s, 0)
t, _ = one_round(s, 1)
print(f"sequential: {t:.3f} s/round = {1000 * t / (steps * clients):.3f} ms per client step", flush=True)

if dev.type == "cuda":
    for engine, flags in (("sequential", {}), ("batched", {"step_runner": "graph"}), ("batched", {"step_runner": "eager"})):
        s = server(engine, **flags)
        one_round(s, 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                one_round(s, 1)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        msgs = [str(w.message).splitlines()[0][:90] for w in caught if "synchroniz" in str(w.message)]
        print(f"host syncs in one round, {engine} {flags}: {len(msgs)} ({clients} clients x {steps} steps)"
              + (f"; e.g. {sorted(set(msgs))[:3]}" if msgs else ""), flush=True)
if "compiled" in runners:
    bench("compiled")

if os.environ.get("SB_PROFILE") == "1" and dev.type == "cuda":
    from torch.profiler import ProfilerActivity, profile

    def self_us(event):  # torch >= 2.4 names it self_device_time_total; older ones self_cuda_time_total
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)

    for runner in ("eager", "graph"):
        s = server("batched", step_runner=runner)
        one_round(s, 0)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall, _ = one_round(s, 1)
        events = sorted(prof.key_averages(), key=self_us, reverse=True)
        total = sum(self_us(e) for e in events)
        print(f"profile, batched {runner}: kernels {total / 1000 / steps:.3f} ms per cohort step, wall "
              f"{1000 * wall / steps:.3f} ms (profiled round)", flush=True)
        for e in events[:12]:
            print(f"  {self_us(e) / 1000 / steps:7.3f} ms/step  x{e.count / steps:5.1f}  {e.key[:110]}", flush=True)
