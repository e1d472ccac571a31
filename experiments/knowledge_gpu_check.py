"""GPU check of the knowledge-transfer algorithms (one GPU, about 6 minutes on an H200):
a 2-round CUDA smoke of each on toy data (FedMix also under AdaFL selection), then directional
runs on MNIST (Dirichlet 0.1, 20 clients, CNN, full participation, batch 50, lr 0.05, R rounds,
seed 0) of FedAvg, Local and each algorithm; one JSON line per run in $OUT/device.jsonl.

    cd dataset && python generate_MNIST.py noniid - dir --out-dir MNIST && cd ..   # downloads MNIST; or --raw-dir DIR
    OUT=/tmp/out python experiments/knowledge_gpu_check.py 20      # from the repository root
"""
import json, os, sys, time, tempfile, pathlib
sys.path[:0] = ["system", "tests/system"]
import h5py, numpy as np, torch
import main
from toydata import make_dataset
OUT = pathlib.Path(os.environ.get("OUT", "."))
log = open(OUT / "device.jsonl", "a")
def emit(**kw):
    log.write(json.dumps(kw) + "\n"); log.flush(); print(json.dumps(kw), flush=True)
emit(device=torch.cuda.get_device_name(0), torch=torch.__version__, tree=os.path.exists("system/flcore/servers/serverfedproto.py"))
ALGOS = ["FedProto", "FD", "FedGH", "FML", "FedKD", "FedPAC", "FedMix", "KT-pFL"]
NEEDS = {"KT-pFL": ["--public_data", "0.05"]}
tmp = pathlib.Path(tempfile.mkdtemp())
toy = make_dataset(tmp, num_clients=4, input_shape=(1, 8, 8))
for algo in ALGOS + ["FedMix+adafl"]:
    name, extra = (algo.split("+")[0], ["--select", "adafl"]) if "+" in algo else (algo, [])
    t = time.time()
    rc = main.main(["-data", str(toy), "-m", "DNN", "-algo", name, "-gr", "2", "-jr", "0.75", "-dev", "cuda", "-q", "True",
                    "--progress", "False", "--results_dir", str(tmp / "smoke" / algo), *NEEDS.get(name, []), *extra])
    emit(smoke=algo, rc=rc, s=round(time.time() - t, 1))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
for algo in ["FedAvg", "Local"] + ALGOS:
    t = time.time()
    res = tmp / "dir" / algo
    rc = main.main(["-data", "dataset/MNIST", "-m", "CNN", "-algo", algo, "-gr", str(rounds), "-jr", "1", "-lbs", "50",
                    "-lr", "0.05", "-dev", "cuda", "-q", "True", "--progress", "False", "--results_dir", str(res),
                    *NEEDS.get(algo, [])])
    row = {"run": algo, "rc": rc, "wall_s": round(time.time() - t, 1)}
    for f in res.glob("*.h5"):
        with h5py.File(f) as h:
            acc = h["rs_test_acc"][()]
            row.update(best=float(np.nanmax(acc)), final=float(acc[-1]), s_per_round=float(np.median(h["rs_round_time"][()])),
                       up_per_round=float(np.mean(h["rs_bytes_up"][()])), down_per_round=float(np.mean(h["rs_bytes_down"][()])))
            for extra in ("rs_test_acc_proto", "rs_test_acc_mentee", "rs_test_acc_global"):
                if extra in h:
                    row[extra] = float(h[extra][()][-1])
    emit(**row)
