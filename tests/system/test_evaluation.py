"""Evaluation of one model per client (flcore/evaluation.py) against a one-by-one reference.

The reference evaluates each client's flat vector in its own, separately built module (parameters
and BatchNorm statistics copied in), on all of the client's rows at once, with sklearn's AUC:
nothing of the code under test. Every grouping (client by client, vmap groups of several sizes,
shared tensors, halving after running out of memory, the fallback for models vmap cannot run)
must give the reference's numbers up to float rounding."""
from __future__ import annotations

import logging
import threading
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

import main
from flcore import evaluation
from fltest import TinyLinear, build_server, dataset_from_arrays, make_args, notices, one_thread  # noqa: F401
from toydata import make_dataset
from utils.mem_utils import OUT_OF_MEMORY

NUM_CLASSES = 4
SHAPE = (1, 8, 8)
#: (train, test) rows per client: ragged, with a client without test rows and one without train rows
SIZES = [(7, 9), (3, 1), (12, 14), (0, 5), (5, 0), (9, 6), (4, 11)]


def ragged_images(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    clients = []
    for n_train, n_test in SIZES:
        clients.append((torch.randn(n_train, *SHAPE, generator=g), torch.randint(0, NUM_CLASSES, (n_train,), generator=g),
                        torch.randn(n_test, *SHAPE, generator=g), torch.randint(0, NUM_CLASSES, (n_test,), generator=g)))
    return dataset_from_arrays(clients, NUM_CLASSES)


class SmallBNNet(nn.Module):
    """Convolution, BatchNorm (float buffers in the flat vector), dropout (off in eval mode)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5),
                                  nn.Linear(3 * 6 * 6, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


class FlatLinear(nn.Module):
    """No buffers: a linear classifier on the flattened image."""

    def __init__(self):
        super().__init__()
        self.body = nn.Flatten()
        self.head = nn.Linear(int(np.prod(SHAPE)), NUM_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


class ItemNet(FlatLinear):
    """A forward vmap cannot run (``.item()`` of a batched tensor); the result is unchanged by it."""

    def forward(self, x):
        scale = float(x.new_ones(()).sum().item())
        return self.head(self.body(x)) * scale


MODELS = {"linear": FlatLinear, "batchnorm": SmallBNNet, "item": ItemNet}


def make_server(model: str, *flags: str, **settings):
    torch.manual_seed(0)
    settings = {"eval_batch_size": 4, **settings}
    return build_server(make_args("Local", *flags, **settings), ragged_images(), MODELS[model]())


def personal_vectors(server, seed: int = 1) -> list[torch.Tensor]:
    """A different vector per client, BatchNorm statistics included (variances kept positive)."""
    g = torch.Generator().manual_seed(seed)
    base = server.global_params
    vectors = []
    for _ in server.clients:
        v = base + 0.3 * torch.randn(base.shape, generator=g)
        for seg in server.model.segments:
            if not seg.is_param:
                values = torch.rand(seg.stop - seg.start, generator=g)
                v[seg.start : seg.stop] = values + 0.5 if "running_var" in seg.name else values - 0.5
        vectors.append(v)
    return vectors


def reference(server, vectors: list[torch.Tensor]):
    """(client accuracies, sample-weighted accuracy, AUC, mean train loss), one client at a time."""
    correct, test_n, auc, loss_sum, train_n = [], [], [], 0.0, 0
    for client, vector in zip(server.clients, vectors):
        torch.manual_seed(0)
        module = type(server.model.module)()
        for seg in server.model.segments:
            target = module.get_parameter(seg.name) if seg.is_param else module.get_buffer(seg.name)
            target.data.copy_(vector[seg.start : seg.stop].view(seg.shape))
        module.eval()
        with torch.no_grad():
            data = client.data
            if len(data.test_y):
                logits = module(data.test_x)
                correct.append(int((logits.argmax(1) == data.test_y).sum()))
                onehot = np.eye(NUM_CLASSES)[data.test_y.numpy()]
                auc.append(roc_auc_score(onehot.ravel(), logits.softmax(1).numpy().ravel()))
            else:
                correct.append(0)
                auc.append(0.0)
            test_n.append(len(data.test_y))
            if len(data.train_y):
                loss_sum += float(F.cross_entropy(module(data.train_x), data.train_y, reduction="sum"))
            train_n += len(data.train_y)
    correct, test_n, auc = map(np.asarray, (correct, test_n, auc))
    client_acc = np.divide(correct, test_n, out=np.zeros(len(test_n)), where=test_n > 0)
    return client_acc, correct.sum() / test_n.sum(), (auc * test_n).sum() / test_n.sum(), loss_sum / train_n


def assert_matches(result, expected) -> None:
    client_acc, acc, auc, loss = expected
    np.testing.assert_allclose(result.client_acc, client_acc, atol=1e-12)
    assert result.test_acc == pytest.approx(acc, abs=1e-12)
    assert result.test_auc == pytest.approx(auc, rel=1e-6)
    assert result.train_loss == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("model", ["linear", "batchnorm"])
@pytest.mark.parametrize("group", [0, 1, 2, 3, 7, 50])
def test_personal_models_match_the_one_by_one_reference(model, group):
    server = make_server(model, eval_group=group)
    vectors = personal_vectors(server)
    assert_matches(server.evaluate_models(lambda i: vectors[i]), reference(server, vectors))


@pytest.mark.parametrize("group", [1, 3])
def test_shared_and_personal_models_mixed(group):
    """The global tensor for some clients (a personalised algorithm's untrained clients), personal
    vectors for the others, in an order that makes the shared tensor appear alone first."""
    server = make_server("batchnorm", eval_group=group)
    vectors = personal_vectors(server)
    uses_global = {0, 2, 3, 6}
    mixed = [server.global_params if i in uses_global else v for i, v in enumerate(vectors)]
    assert_matches(server.evaluate_models(lambda i: mixed[i]), reference(server, mixed))
    everyone = [server.global_params] * len(vectors)
    assert_matches(server.evaluate_models(lambda i: everyone[i]), reference(server, everyone))


def test_models_are_fetched_once_and_few_are_alive():
    """Memory is bounded: each client's model is asked for once and at most group + 1 personal
    vectors are alive when the next one is made."""
    group = 2
    server = make_server("linear", eval_group=group)
    vectors = personal_vectors(server)
    alive: list[weakref.ref] = []
    calls = []

    def fresh_copy(i):
        calls.append(i)
        assert sum(ref() is not None for ref in alive) <= group + 1
        copy = vectors[i].clone()
        alive.append(weakref.ref(copy))
        return copy

    result = server.evaluate_models(fresh_copy)
    assert calls == list(range(len(vectors)))
    assert_matches(result, reference(server, vectors))


def test_a_model_vmap_cannot_run_is_evaluated_one_by_one(notices):  # noqa: F811
    server = make_server("item", eval_group=3)
    vectors = personal_vectors(server)
    assert_matches(server.evaluate_models(lambda i: vectors[i]), reference(server, vectors))
    assert_matches(server.evaluate_models(lambda i: vectors[i]), reference(server, vectors))
    said = [r.getMessage() for r in notices if "vmap" in r.getMessage()]
    assert len(said) == 1 and "client by client" in said[0]


def test_running_out_of_memory_halves_the_group(monkeypatch, notices):  # noqa: F811
    server = make_server("batchnorm", eval_group=7)
    vectors = personal_vectors(server)
    real = evaluation.Evaluator._forward_stacked

    def small_device(self, stacked, split, rows):
        if len(stacked) > 2:
            raise OUT_OF_MEMORY("pretend the device is full")
        return real(self, stacked, split, rows)

    monkeypatch.setattr(evaluation.Evaluator, "_forward_stacked", small_device)
    assert_matches(server.evaluate_models(lambda i: vectors[i]), reference(server, vectors))
    assert any("out of memory with 7 models" in r.getMessage() for r in notices if r.levelno == logging.WARNING)


def test_auto_group_is_one_on_a_cpu_and_sized_from_memory_on_a_gpu(monkeypatch):
    server = make_server("linear")
    assert server.evaluator.group_size(len(server.clients)) == 1
    # TinyLinear on 5 features: input 5 floats, Identity 5, Linear 3 -> 13 floats = 52 bytes, doubled
    tiny = build_server(make_args("Local", eval_batch_size=10), ragged_vectors_dataset(), TinyLinear(5, 3))
    assert tiny.evaluator._activation_bytes_per_sample() == 104
    per_client = tiny.model.vector.numel() * 4 + 10 * 104
    monkeypatch.setattr(evaluation, "device_room", lambda device: (40 * per_client + 3, 10**12))
    assert tiny.evaluator._group_for_memory() == 10  # a quarter of the room


def ragged_vectors_dataset():
    g = torch.Generator().manual_seed(3)
    return dataset_from_arrays([(torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g),
                                 torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g))
                                for n in (6, 2, 9)], 3)


def test_whole_runs_agree_across_group_sizes():
    """Local training for two rounds: the recorded curves do not depend on ``--eval_group``."""
    runs = []
    for group in (1, 4):
        torch.manual_seed(0)
        server = build_server(make_args("Local", eval_group=group, eval_batch_size=4, global_rounds=2, batch_size=3,
                                        save_model=False), ragged_images(), SmallBNNet())
        server.train(progress=False)
        runs.append(server.history)
    one, grouped = runs
    assert one.test_acc == pytest.approx(grouped.test_acc, abs=1e-12)
    assert one.test_auc == pytest.approx(grouped.test_auc, rel=1e-6)
    assert one.train_loss == pytest.approx(grouped.train_loss, rel=1e-5)


@pytest.mark.parametrize("argv, needle", [(["--eval_group", "-1"], "--eval_group must be >= 0"),
                                          (["--eval_batch_size", "-1"], "--eval_batch_size")])
def test_bad_evaluation_flags_are_one_line_errors(tmp_path, capsys, argv, needle):
    folder = make_dataset(tmp_path, num_clients=3, input_shape=(1, 8, 8))
    code = main.main(["-data", str(folder), "-m", "DNN", "-algo", "Local", "-gr", "1", "-dev", "cpu",
                      "--progress", "False", "--results_dir", str(tmp_path / "res"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("group", [1, 3])
def test_params_for_may_use_autograd(group):
    """PerAvg's evaluated model is one gradient step from the global model, taken inside
    ``params_for``: the evaluation must not switch gradients off around it."""
    server = make_server("linear", eval_group=group)
    vectors = personal_vectors(server)

    def one_step(i):
        w = vectors[i].clone().requires_grad_(True)
        (grad,) = torch.autograd.grad((w * w).sum(), w)
        return (w - 0.01 * grad).detach()

    stepped = [one_step(i) for i in range(len(vectors))]
    assert_matches(server.evaluate_models(one_step), reference(server, stepped))


@pytest.mark.parametrize("shared", [True, False])
def test_cpu_batches_spread_over_threads_give_the_one_thread_numbers(shared):
    """With two intra-op threads a CPU pass computes its batches in two worker threads, each on one
    intra-op thread without autograd: the results equal those of one thread bit for bit."""
    server = make_server("batchnorm")
    vectors = [server.global_params] * len(server.clients) if shared else personal_vectors(server)
    seen = []
    server.model.module.register_forward_pre_hook(
        lambda module, inputs: seen.append((threading.current_thread().name, torch.get_num_threads(),
                                            torch.is_grad_enabled())))
    one = server.evaluate_models(lambda i: vectors[i])
    assert {name for name, _, _ in seen} == {threading.current_thread().name}  # one thread: no workers
    seen.clear()
    torch.set_num_threads(2)
    try:
        two = server.evaluate_models(lambda i: vectors[i])
    finally:
        torch.set_num_threads(1)
        server.evaluator.close()
    # a pass of one batch (a personal model's few rows) stays on the calling thread
    workers = {(threads, grad) for name, threads, grad in seen if name.startswith("fl-eval")}
    assert workers == {(1, False)} and not any(grad for _, _, grad in seen)
    assert list(two.client_acc) == list(one.client_acc)
    assert (two.test_acc, two.test_auc, two.train_loss) == (one.test_acc, one.test_auc, one.train_loss)
    assert_matches(two, reference(server, vectors))


def test_threaded_runs_give_the_same_curves_on_one_and_two_threads():
    """The threaded engine trains on one intra-op thread per worker and evaluation spreads its
    batches the same way, so a run's curves and final model do not depend on the thread count
    (with the dropout left in, the engine trains on the main thread's two threads, and the final
    models differed)."""
    runs = []
    for threads in (1, 2):
        torch.manual_seed(0)
        module = SmallBNNet()
        module.body[4] = nn.Identity()  # no dropout: the threaded engine trains every client in its workers
        server = build_server(make_args("FedAvg", engine="threaded", workers=2, eval_batch_size=4, global_rounds=2,
                                        batch_size=3, save_model=False), ragged_images(), module)
        torch.set_num_threads(threads)
        try:
            server.train(progress=False)
        finally:
            torch.set_num_threads(1)
            server.close()
        runs.append((server.history, server.global_params))
    (one, w1), (two, w2) = runs
    assert torch.equal(w1, w2)
    assert (one.test_acc, one.test_auc, one.train_loss) == (two.test_acc, two.test_auc, two.train_loss)


# ------------------------------------------------------------------ frozen copies (CPU)
def _frozen_setup(module_factory, frozen: bool, rows: int = 320):
    """Two clients of ``rows`` test rows each (one shared pass of 2 x ``rows`` >= MIN_ROWS) and
    few train rows, the CNN-like ``module_factory()``, ``--eval_frozen frozen``."""
    g = torch.Generator().manual_seed(3)
    clients = [(torch.randn(6, *SHAPE, generator=g), torch.randint(0, NUM_CLASSES, (6,), generator=g),
                torch.randn(rows, *SHAPE, generator=g), torch.randint(0, NUM_CLASSES, (rows,), generator=g))
               for _ in range(2)]
    torch.manual_seed(0)
    return build_server(make_args("FedAvg", eval_frozen=frozen), dataset_from_arrays(clients, NUM_CLASSES),
                        module_factory())


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 8),
                                  nn.ReLU())
        self.head = nn.Linear(8, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


class BranchingNet(SmallCNN):
    """Python control flow on the data: a trace would keep the branch of its example rows."""

    def forward(self, x):
        out = super().forward(x)
        return out if float(x.mean()) > 0 else -out


def _evaluate(server):
    return server.evaluate_models(lambda i: server.global_params)


def test_a_frozen_copy_gives_the_eager_numbers_up_to_rounding(monkeypatch):
    from flcore import frozen

    built = []
    real_copy = evaluation.frozen_copy
    monkeypatch.setattr(evaluation, "frozen_copy", lambda *a: built.append(1) or real_copy(*a))
    results = {flag: _evaluate(_frozen_setup(SmallCNN, flag)) for flag in (False, True)}
    assert len(built) == 1  # the 640 test rows made one frozen pass; the 12 train rows ran eagerly
    eager, fast = results[False], results[True]
    assert fast.test_acc == pytest.approx(eager.test_acc, abs=1 / 640)
    assert fast.test_auc == pytest.approx(eager.test_auc, abs=1e-4)
    assert fast.train_loss == pytest.approx(eager.train_loss, rel=1e-6)
    # and the copy itself, on the rows
    server = _frozen_setup(SmallCNN, True)
    x = server.dataset.split("test")[0]
    module = server.model.module.eval()
    with torch.no_grad():
        copy = frozen.frozen_copy(module, x[:2])
        assert frozen.close_enough(copy(x), module(x))
        copy.release()
        assert not frozen.close_enough(module(x) + 1e-2, module(x))


class _Shifted:
    """A frozen copy whose logits are off by 1."""

    def __init__(self, copy):
        self.copy = copy

    def __call__(self, x):
        return self.copy(x) + 1.0

    def release(self):
        self.copy.release()


def test_each_frozen_copy_is_freed_after_its_pass(monkeypatch):
    """PyTorch keeps a traced module's graphs in its global compilation unit for good (pytorch#35600):
    every copy must go into a unit of its own, emptied after the pass, so evaluating again and again
    leaves nothing behind (with the global unit this test sees its functions grow by each copy's)."""
    from flcore import frozen

    shared = torch.jit._state._python_cu
    before = len(shared.get_functions())
    copies, trims = [], []
    monkeypatch.setattr(frozen, "return_free_heap_pages", lambda: trims.append(1))
    real_copy = evaluation.frozen_copy
    monkeypatch.setattr(evaluation, "frozen_copy", lambda *a: copies.append(real_copy(*a)) or copies[-1])
    server = _frozen_setup(SmallCNN, True)
    for _ in range(2):
        _evaluate(server)
    assert len(copies) == 2 and len(shared.get_functions()) == before
    assert all(c._script is None and not c._unit.get_functions() for c in copies)
    assert trims == [1, 1]  # and the heap's free pages went back after each pass
    with pytest.raises(RuntimeError, match="released"):
        copies[0](server.dataset.split("test")[0][:2])
    assert torch.jit._state._python_cu is shared


@pytest.mark.parametrize("case", ["hook", "branch", "wrong"])
def test_no_frozen_copy_where_it_cannot_be_trusted_one_notice(monkeypatch, notices, case):  # noqa: F811
    """A forward hook, data-dependent control flow, or a copy whose first batch differs from the
    eager model: the eager model's numbers exactly, and one notice for the run."""
    factory = BranchingNet if case == "branch" else SmallCNN
    reference = _evaluate(_frozen_setup(factory, False))
    server = _frozen_setup(factory, True)
    if case == "hook":
        server.model.module.body[0].register_forward_hook(lambda *args: None)
    if case == "wrong":
        real_copy = evaluation.frozen_copy
        monkeypatch.setattr(evaluation, "frozen_copy", lambda *a: _Shifted(real_copy(*a)))
    for _ in range(2):
        result = _evaluate(server)
        assert (result.test_acc, result.test_auc, result.train_loss) == \
            (reference.test_acc, reference.test_auc, reference.train_loss)
    said = [r.getMessage() for r in notices if "no frozen copy" in r.getMessage()]
    assert len(said) == 1, said


def test_auto_eval_batch_is_per_device():
    """``--eval_batch_size 0``: 128 on a CPU, larger on a GPU (batches of 128 leave it launch-bound);
    an explicit size is kept on both, and the server writes the resolved size back for every reader."""
    from flcore.evaluation import resolve_eval_batch
    assert resolve_eval_batch(0, torch.device("cpu")) == 128
    assert resolve_eval_batch(0, torch.device("cuda")) == 2048
    assert resolve_eval_batch(7, torch.device("cuda")) == resolve_eval_batch(7, torch.device("cpu")) == 7
    server = make_server("linear", eval_batch_size=0)
    assert server.args.eval_batch_size == 128 and server.evaluator.batch_size == 128


def test_no_frozen_copy_by_default_because_pytorch_keeps_every_one(monkeypatch):
    """Each traced, frozen copy stays in the process for good (pytorch#35600), so a default run that
    made one per evaluation would grow without bound: the default evaluates the eager module."""
    monkeypatch.setattr(evaluation, "frozen_copy", lambda *a: pytest.fail("a frozen copy was built by default"))
    server = build_server(make_args("FedAvg"), _frozen_setup(SmallCNN, True).dataset, SmallCNN())
    assert server.args.eval_frozen is False
    _evaluate(server)


def test_a_classifier_of_each_clients_model_is_scored_on_its_test_rows_as_the_reference():
    server = make_server("batchnorm", eval_batch_size=3)
    vectors = personal_vectors(server)
    server.model.module.train()
    working = server.model.vector.clone()
    accuracy = server.evaluator.test_accuracy(lambda i: vectors[i], lambda net, x: net(x).argmax(1))
    assert accuracy == pytest.approx(reference(server, vectors)[1], abs=1e-12)
    assert torch.equal(server.model.vector, working) and server.model.module.training  # nothing left changed
    shifted = server.evaluator.test_accuracy(lambda i: vectors[i], lambda net, x: (net(x).argmax(1) + 1) % NUM_CLASSES)
    assert shifted != accuracy


def test_any_function_of_a_model_runs_on_batches_of_chosen_rows():
    server = make_server("linear")
    x = server.dataset.split("test")[0]
    rows = torch.tensor([5, 0, 7, 3, 9])
    sizes = server.evaluator.map_batches(server.global_params, x, lambda net, batch: len(batch), rows=rows,
                                         batch_size=2)
    assert sizes == [2, 2, 1]
    logits = server.evaluator.map_batches(server.global_params, x, lambda net, batch: net(batch), rows=rows)
    server.model.load(server.global_params)
    server.model.module.eval()
    with torch.no_grad():
        assert torch.allclose(torch.cat(logits), server.model.module(x[rows]), atol=1e-6)
