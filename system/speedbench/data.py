"""The benchmark's data: MNIST partitioned by the real generator, or class-prototype images of the same
shapes (P1), and CIFAR-shaped random clients (P2, P3)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from speedbench.configs import REPO


def _synthetic_clients(sizes_train, sizes_test, labels_of, shape, num_classes, seed):
    """Class-prototype images plus noise, written client by client into one tensor per split.

    Returns (clients, merged) as ``load_federated_dataset`` does: the clients' tensors are views of
    the merged ones, so the data are held once (P2/P3's 60,000 CIFAR-shaped samples: 737 MB)."""
    import numpy as np
    import torch

    from fldata.loading import ClientData, split_views

    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(num_classes, *shape)).astype(np.float32)
    sizes = {"train": sizes_train, "test": sizes_test}
    merged = {}
    for split, counts in sizes.items():
        total = int(sum(counts))
        merged[split] = (torch.empty((total, *shape)), torch.empty(total, dtype=torch.long))
    starts = {"train": 0, "test": 0}
    for cid, (n_train, n_test) in enumerate(zip(sizes_train, sizes_test)):
        for split, n in (("train", n_train), ("test", n_test)):
            y = labels_of(cid, n, rng)
            x = prototypes[y] + rng.normal(scale=1.0, size=(n, *shape)).astype(np.float32)
            all_x, all_y = merged[split]
            lo, hi = starts[split], starts[split] + n
            all_x[lo:hi].copy_(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
            all_y[lo:hi].copy_(torch.from_numpy(y.astype(np.int64)))
            starts[split] = hi
    views = {split: split_views(x, y, sizes[split]) for split, (x, y) in merged.items()}
    clients = [ClientData(cid, *views["train"][cid], *views["test"][cid]) for cid in range(len(sizes_train))]
    return clients, merged


def synthetic_mnist(seed: int = 1):
    """Random data shaped like P1: 70,000 1x28x28 images over 20 clients by Dirichlet(0.1), 75% train."""
    import numpy as np

    from fldata.loading import FederatedDataset

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

    from fldata.loading import FederatedDataset

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
    from fldata.loading import split_views

    dataset.merged = {split: tuple(t.to(device) for t in tensors) for split, tensors in dataset.merged.items()}
    for split, (all_x, all_y) in dataset.merged.items():
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
