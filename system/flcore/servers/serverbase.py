"""The base server: the only round loop of the platform.

One round (PFLlib's order)::

    cohort  = select_clients(t)
    evaluate(t)                      every -eg rounds, before training, so entry 0 is the initial model
    package = make_package(t, cohort)
    updates = engine.train(clients, package)   the one seam to local training
    updates = drop_uploads(updates)            -cdr
    aggregate(updates, package)
    after_round(t, package, updates)

PFLlib runs ``gr + 1`` rounds and evaluates before each, so the last round's training is never
measured. We evaluate at rounds 0..gr and train rounds 0..gr-1: the recorded curve is identical
and the unmeasured final training is skipped. ``rs_eval_rounds`` holds how many aggregations each
evaluation saw.

Algorithms subclass :class:`Server`, set ``client_cls`` and override the hooks above; flags are
declared with an ``add_args`` classmethod in the algorithm's own file.
"""
from __future__ import annotations

import logging
import time
from argparse import ArgumentParser, Namespace
from typing import Callable, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flcore.clients.clientbase import Client, ClientUpdate, RoundPackage
from flcore.flat import FlatModel
from flcore.registry import ENGINES, SELECTORS
from flcore.state import make_state_store
from flcore.trainmodel.layout import resolve_conv_layout, use_channels_last
from utils.cli import hyperparameters
from utils.data_utils import FederatedDataset, decode_inputs
from utils.errors import FLError
from utils.metrics import EvalResult, combine, micro_auc
from utils.result_utils import RunHistory
from utils.seeding import numpy_rng

log = logging.getLogger("fl")


def weighted_average(updates: list[ClientUpdate], weights: list[float] | np.ndarray | None = None) -> torch.Tensor:
    """Σ_k w_k · params_k accumulated in place, in update order (default w_k ∝ samples)."""
    if weights is None:
        counts = np.asarray([u.num_samples for u in updates], dtype=np.float64)
        weights = counts / counts.sum() if counts.sum() > 0 else np.full(len(updates), 1 / len(updates))
    total = torch.zeros_like(updates[0].params)
    for update, weight in zip(updates, weights):
        total.add_(update.params, alpha=float(weight))
    return total


class Server:
    """FedAvg's server; algorithms override hooks, never the loop."""

    client_cls: ClassVar[type[Client]] = Client
    #: evaluate each client's own model (``eval_params``) instead of one global model
    personalized: ClassVar[bool] = False
    #: personalised algorithms with a meaningful shared model also report its accuracy
    has_global_model: ClassVar[bool] = True
    #: a selection policy this algorithm always uses (e.g. AdaFL); None = the ``--select`` flag
    selector_name: ClassVar[str | None] = None

    def __init__(self, args: Namespace, dataset: FederatedDataset, module: nn.Module, device: torch.device):
        self.args = args
        self.hp = hyperparameters(args, type(self), self.client_cls)  # typed, frozen: this algorithm's own flags
        self.dataset = dataset
        self.device = device
        self.num_classes = dataset.num_classes
        if resolve_conv_layout(args.conv_layout, device) == "channels_last":
            use_channels_last(module)
        self.model = FlatModel(module, device)
        self.global_params = self.model.snapshot()
        self.state = make_state_store(args, device)
        self.clients = [self.client_cls(i, data, args, self.state) for i, data in enumerate(dataset.clients)]
        self._mark_slow_clients()
        self.selector = SELECTORS.get(self.selector_name or args.select)(self, args)
        self.engine = ENGINES.get(args.engine)(self)
        self.history = RunHistory()
        self._test_cat: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._train_cat: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.setup()

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        """Declare this algorithm's server flags (called once per class in the MRO)."""

    # ------------------------------------------------------------------ hooks
    def setup(self) -> None:
        """Create algorithm state (server momentum, controls, ...) after the base is built."""

    def select_clients(self, rnd: int) -> list[int]:
        return self.selector.select(rnd)

    def make_package(self, rnd: int, cohort: list[int]) -> RoundPackage:
        return RoundPackage(rnd, self.global_params, cohort)

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        """FedAvg: the new global model is the sample-weighted mean of the uploaded models."""
        self.global_params = weighted_average(updates)

    def after_round(self, rnd: int, package: RoundPackage, updates: list[ClientUpdate]) -> None:
        self.selector.observe(rnd, package, updates)

    def eval_params(self, index: int) -> torch.Tensor:
        """The model evaluated on client ``index`` (personalised algorithms override)."""
        return self.global_params

    def summary(self) -> dict[str, object]:
        """Algorithm hyperparameters logged at the start of a run."""
        return {}

    # ------------------------------------------------------------- the loop
    def train(self, progress: bool = True) -> RunHistory:
        args = self.args
        rounds = int(args.global_rounds)
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is a declared dependency
            tqdm = None
        bar = tqdm(total=rounds + 1, desc=args.algorithm, unit="round", disable=not progress or tqdm is None, leave=False)
        for rnd in range(rounds + 1):
            start = time.perf_counter()
            is_last = rnd == rounds
            cohort = self.select_clients(rnd) if not is_last else []
            if rnd % args.eval_gap == 0 or is_last:
                result = self.evaluate(rnd)
                bar.set_postfix(acc=f"{result.test_acc:.4f}")
            if is_last:
                bar.update(1)
                break
            package = self.make_package(rnd, cohort)
            updates = self.engine.train([self.clients[i] for i in cohort], package)
            updates = self.drop_uploads(rnd, updates)
            if updates:
                self.aggregate(updates, package)
                self._check_finite(rnd)
            self.after_round(rnd, package, updates)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # a round's time includes the kernels it launched
            self.history.round_time.append(time.perf_counter() - start)
            self.history.bytes_down.append(package.nbytes() * len(cohort))
            self.history.bytes_up.append(sum(u.nbytes() for u in updates))
            self.history.clients_per_round.append(len(updates))
            bar.update(1)
            if args.auto_break and self._stalled():
                log.info("auto-break: best accuracy is more than %d evaluations old", args.top_cnt)
                break
        bar.close()
        return self.history

    def close(self) -> None:
        """Release the engine's worker threads and the state store's files (the run is over)."""
        close_engine = getattr(self.engine, "close", None)
        if close_engine is not None:
            close_engine()
        self.state.close()

    def drop_uploads(self, rnd: int, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """``-cdr``: a random fraction of the uploads never arrives (drawn per round)."""
        rate = float(self.args.client_drop_rate)
        if rate <= 0 or not updates:
            return updates
        keep = numpy_rng(self.args.seed, "drop", rnd).random(len(updates)) >= rate
        return [u for u, k in zip(updates, keep) if k]

    def _mark_slow_clients(self) -> None:
        rate = float(self.args.train_slow_rate)
        count = int(round(rate * len(self.clients)))
        if count:
            chosen = numpy_rng(self.args.seed, "slow-clients").choice(len(self.clients), count, replace=False)
            for i in chosen:
                self.clients[int(i)].slow = True

    def _check_finite(self, rnd: int) -> None:
        if not bool(torch.isfinite(self.global_params).all()):
            raise FLError(
                f"the global model has NaN/inf values after round {rnd}; lower the learning rate (-lr)"
            )

    def _stalled(self) -> bool:
        acc = self.history.test_acc
        return len(acc) > self.args.top_cnt and int(np.argmax(acc)) < len(acc) - self.args.top_cnt

    # --------------------------------------------------------- evaluation
    def _concatenated(self, split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cached = self._test_cat if split == "test" else self._train_cat
        if cached is None:
            if split in self.dataset.merged and len(self.dataset.clients) == len(self.clients):
                cached = self.dataset.merged[split]  # the clients' tensors are views of it: no copy
            else:
                xs = [getattr(c.data, f"{split}_x") for c in self.clients]
                ys = [getattr(c.data, f"{split}_y") for c in self.clients]
                owner = torch.cat([torch.full((len(y),), i, dtype=torch.long, device=y.device) for i, y in enumerate(ys)])
                cached = (torch.cat(xs), torch.cat(ys), owner)
            if split == "test":
                self._test_cat = cached
            else:
                self._train_cat = cached
        return cached

    @torch.no_grad()
    def _forward(self, params: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Logits of the model ``params`` on ``x``, in large batches (eval mode)."""
        self.model.load(params)
        self.model.module.eval()
        bs = int(self.args.eval_batch_size)
        table = self.dataset.input_table  # uint8 input codes are decoded batch by batch
        logits = torch.zeros(len(x), self.num_classes, dtype=self.model.params.dtype, device=self.device)
        # Written into one tensor allocated up front: keeping a small output per batch alive between
        # the batches' large activations fragmented glibc's heap, which then grew by up to 1.5 GB
        # over one P1 evaluation (freed but never reused; measured with mallinfo2).
        for i in range(0, len(x), bs):
            logits[i : i + bs] = self.model.module(decode_inputs(x[i : i + bs], table))
        return logits

    def evaluate_models(self, params_for: Callable[[int], torch.Tensor], train_loss: bool = True) -> EvalResult:
        """Test accuracy/AUC on every client's test split and train loss on every train split.

        Clients evaluated with the same tensor (the global model) are run in one pass over the
        concatenated data; personalised models are evaluated client by client."""
        n = len(self.clients)
        correct, test_n, auc = np.zeros(n), np.zeros(n), np.full(n, np.nan)
        loss_sum, train_n = 0.0, 0
        groups: dict[int, tuple[torch.Tensor, list[int]]] = {}
        for i in range(n):
            params = params_for(i)
            groups.setdefault(id(params), (params, []))[1].append(i)
        for params, members in groups.values():
            for split in ("test", "train"):
                if split == "train" and not (train_loss and self.args.eval_train_loss):
                    continue
                if len(members) == n:
                    x, y, owner = self._concatenated(split)
                else:
                    parts = [(getattr(self.clients[i].data, f"{split}_x"), getattr(self.clients[i].data, f"{split}_y"), i) for i in members]
                    x = torch.cat([p[0] for p in parts])
                    y = torch.cat([p[1] for p in parts])
                    owner = torch.cat([torch.full((len(p[1]),), p[2], dtype=torch.long, device=y.device) for p in parts])
                logits = self._forward(params, x)
                if split == "train":
                    loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
                    train_n += len(y)
                    continue
                hits = (logits.argmax(1) == y).double()
                correct += torch.zeros(n, dtype=torch.float64, device=y.device).index_add_(0, owner, hits).cpu().numpy()
                test_n += torch.bincount(owner, minlength=n).cpu().numpy()
                if self.args.eval_auc:
                    probs = logits.softmax(1).cpu()
                    owner_cpu, y_cpu = owner.cpu(), y.cpu()
                    for i in members:
                        sel = owner_cpu == i
                        auc[i] = micro_auc(probs[sel], y_cpu[sel], self.num_classes)
        return combine(correct, test_n, auc, loss_sum, train_n)

    def evaluate(self, rnd: int) -> EvalResult:
        """Evaluate and record one point of the curves (PFLlib's ``evaluate``)."""
        result = self.evaluate_models(self.eval_params)
        history = self.history
        history.eval_rounds.append(rnd)
        history.test_acc.append(result.test_acc)
        history.test_auc.append(result.test_auc)
        history.test_acc_std.append(result.test_acc_std)
        history.train_loss.append(result.train_loss)
        history.client_acc.append(result.client_acc)
        loss = f"{result.train_loss:.4f}" if self.args.eval_train_loss else "n/a"
        extra = ""
        if self.personalized and self.has_global_model:
            # Personalised runs also report the shared model where one exists (FedACS's Table 1).
            global_result = self.evaluate_models(lambda _: self.global_params, train_loss=False)
            history.add_series("test_acc_global", global_result.test_acc)
            history.add_series("test_auc_global", global_result.test_auc)
            extra = f" | global model acc {global_result.test_acc:.4f}"
        log.info(
            "round %4d | test acc %.4f (std %.4f) | test auc %.4f | train loss %s%s",
            rnd, result.test_acc, result.test_acc_std, result.test_auc, loss, extra,
        )
        return result
