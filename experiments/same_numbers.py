"""Does a change leave an algorithm's numbers exactly as they were? For speed work that must not
change results (cuts of a round's overhead).

For each algorithm, a tiny sequential run (``tests/system/fltest.engine_run``: 5 ragged clients, 3
rounds, batch 5, 60% participation, learning-rate decay; once with the tests' tiny linear model, once
with a small convolutional body/head model) is made with this checkout and with the commit
``--against`` (exported with ``git archive`` into a temporary folder), each in its own process. The
global model, every client's evaluated model, every per-client state tensor and the accuracy and
loss curves must be bit-identical (``torch.equal``, same dtype).

    python experiments/same_numbers.py --against main APPLE pFedMe
    python experiments/same_numbers.py --against HEAD~3 APPLE --flags dr_learning_rate=0.05 mu=0.5

Exit status 0 when every algorithm is identical, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

#: run in a fresh interpreter with the checkout's system/ and tests/system/ first on the path
DUMP = """
import sys, torch, torch.nn as nn
tree, algo, out, *flags = sys.argv[1:]
sys.path[:0] = [tree + "/system", tree + "/tests/system"]
import fltest
torch.set_num_threads(1)

class ConvBodyHead(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(27, 8), nn.ReLU())
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        return self.head(self.body(x))

images = fltest.image_dataset([3, 12, 25, 40, 17], shape=(1, 8, 8), num_classes=3, seed=1)
numbers = {}
for name, data, module_fn in [("linear", None, None), ("conv", images, lambda d: ConvBodyHead(d.num_classes))]:
    server = fltest.engine_run(algo, "sequential", dataset=data, module_fn=module_fn, **dict(f.split("=", 1) for f in flags))
    numbers[name + "/global"] = server.global_params
    for i in range(len(server.clients)):
        numbers[f"{name}/evaluated/{i}"] = server.eval_params(i)
    for state in server.state.names():
        for i in server.state.indices(state):
            value = server.state.get(state, i)
            if isinstance(value, torch.Tensor):
                numbers[f"{name}/state/{state}/{i}"] = value
    numbers[name + "/accuracy"] = torch.tensor(server.history.test_acc, dtype=torch.float64)
    numbers[name + "/loss"] = torch.tensor(server.history.train_loss, dtype=torch.float64)
torch.save(numbers, out)
"""


def numbers_of(tree: Path, algorithm: str, flags: list[str], out: Path) -> dict[str, torch.Tensor]:
    subprocess.run([sys.executable, "-c", DUMP, str(tree), algorithm, str(out), *flags], check=True)
    return torch.load(out, weights_only=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algorithms", nargs="+")
    parser.add_argument("--against", required=True, help="git commit (or branch) to compare with")
    parser.add_argument("--flags", nargs="*", default=[], help="name=value flags of every run (main.py's --name)")
    args = parser.parse_args(argv)
    if any("=" not in f for f in args.flags):
        print("--flags takes name=value pairs, e.g. --flags mu=0.1", file=sys.stderr)
        return 2
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", args.against + "^{commit}"], cwd=REPO,
                      stdout=subprocess.DEVNULL).returncode != 0:
        print(f"--against {args.against}: no such commit in {REPO}", file=sys.stderr)
        return 2
    differing = []
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "archive", args.against, "system", "tests"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        for algorithm in args.algorithms:
            old = numbers_of(old_tree, algorithm, args.flags, Path(tmp) / "old.pt")
            new = numbers_of(REPO, algorithm, args.flags, Path(tmp) / "new.pt")
            changed = sorted(set(old) ^ set(new)) + [k for k in old.keys() & new.keys()
                                                     if old[k].dtype != new[k].dtype or not torch.equal(old[k], new[k])]
            print(f"{algorithm}: {'identical' if not changed else 'DIFFERS in ' + ', '.join(changed[:5])} "
                  f"({len(new)} tensors)", flush=True)
            differing += [algorithm] if changed else []
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
