"""Feature facts travel on the protocol: the stragglers plug-in stamps each upload it releases with
its origin, the attack plug-in with the ground truth; algorithms read the uploads, never a plug-in
module or a feature's flags. The formulas several layers share (cohort size, sample weights, a
filter's precision and recall) by hand, and the model-poisoning and robust-rule registries."""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fltest import build_server, make_args, random_dataset
from fltest import one_thread  # noqa: F401  (fixture)
from flcore.features import attacks, robust
from flcore.protocol import ClientUpdate, RoundPackage, cohort_size, filter_precision_recall, joined_clients, sample_weights

SYSTEM = Path(__file__).resolve().parents[2] / "system"
SERVERS = sorted((SYSTEM / "flcore" / "servers").glob("*.py"))
CLIENTS = 6


def server(algorithm: str = "FedAvg", **flags):
    data = random_dataset(num_clients=CLIENTS, dim=4, num_classes=3, seed=4, sizes=[10] * CLIENTS)
    flags = {"batch_size": 5, "global_rounds": 4, **flags}
    return build_server(make_args(algorithm, engine="sequential", num_clients=CLIENTS, **flags), data)


def feature_modules(path: Path) -> list[str]:
    """The feature modules (``flcore.features.<module>``, ``flcore.features.privacy``) the file imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            submodule = parts[:2] == ["flcore", "features"] and len(parts) > 2 and (
                (SYSTEM / "flcore" / "features" / f"{parts[2]}.py").exists()
                or (SYSTEM / "flcore" / "features" / parts[2]).is_dir())
            if submodule:
                found.append(name)
    return found


def test_no_server_imports_a_feature_module_or_reads_a_features_flags():
    assert SERVERS and feature_modules(SYSTEM / "flcore" / "features" / "robust.py")  # the check sees imports
    imports = {path.name: feature_modules(path) for path in SERVERS}
    assert {name: found for name, found in imports.items() if found} == {}
    flags = re.compile(r"args\.(attack|robust|straggler)")
    reads = [f"{path.name}:{n}" for path in SERVERS for n, line in enumerate(path.read_text().splitlines(), 1)
             if flags.search(line)]
    assert reads == []


def test_released_uploads_carry_the_round_and_model_they_started_from():
    srv = server(straggler_delay=2)
    models, late = {}, 0
    for rnd in range(4):
        models[rnd] = srv.global_params.clone()
        result = srv.run_round(rnd, evaluate=False)
        for update, staleness in zip(result.updates, srv.history.extra_series["staleness"][-1]):
            assert update.origin_round == rnd - staleness
            start, params = update.origin(result.package)
            assert start == update.origin_round and torch.equal(params, models[start])
            assert (update.origin_params is None) == (staleness == 0)
            late += staleness > 0
    assert late  # some uploads did arrive late
    plain = server().run_round(0, evaluate=False)  # without stragglers: the round's own package
    update = plain.updates[0]
    assert update.origin_round is None and update.origin(plain.package) == (0, plain.package.global_params)


def test_every_upload_carries_whether_its_client_attacked_in_the_round_it_trained_in():
    srv = server(attack="sign_flip", attack_fraction=0.35, attack_resample=True, straggler_delay=1)
    seen = set()
    for rnd in range(4):
        for update in srv.run_round(rnd, evaluate=False).updates:
            assert update.attacker == bool(srv.plugin("attack").attackers(update.origin_round)[update.index])
            seen.add(update.attacker)
    assert seen == {True, False}
    assert all(u.attacker is None for u in server().run_round(0, evaluate=False).updates)  # no attack: no truth


def upload(index: int, attacker: bool | None) -> ClientUpdate:
    return ClientUpdate(index, 1, 1, torch.zeros(1), 0.0, attacker=attacker)


def test_filter_precision_recall_by_hand():
    kept = [upload(0, False), upload(1, True), upload(2, False)]
    dropped = [upload(3, True), upload(4, True), upload(5, False)]
    assert filter_precision_recall(kept, dropped) == pytest.approx((2 / 3, 2 / 3))
    precision, recall = filter_precision_recall(kept, [])
    assert math.isnan(precision) and recall == 0.0
    precision, recall = filter_precision_recall([upload(0, False)], [upload(1, False)])
    assert precision == 0.0 and math.isnan(recall)


def test_cohort_size_and_sample_weights_by_hand():
    assert joined_clients(100, 0.29) == 29 and cohort_size(100, 0.29) == 29  # not 28: 0.29 * 100 = 28.999...
    assert joined_clients(10, 0.05) == 0 and cohort_size(10, 0.05) == 1 and cohort_size(3, 2.0) == 3
    np.testing.assert_array_equal(sample_weights([1, 3]), [0.25, 0.75])
    np.testing.assert_array_equal(sample_weights([0, 0, 0, 0]), [0.25] * 4)  # nobody has samples: equal weights


def test_the_rules_are_registered_once_under_their_names():
    assert list(robust.AGGREGATORS) == ["mean", "median", "rfa", "centered_clip", "trimmed_mean", "krum", "multi_krum",
                                        "bulyan", "fltrust"]
    assert list(attacks.MODEL_ATTACKS) == ["sign_flip", "gaussian", "alie", "ipm", "minmax"]
    assert attacks.ATTACKS == (*attacks.MODEL_ATTACKS, *attacks.DATA_ATTACKS)
    with pytest.raises(RuntimeError, match="registered twice"):
        robust.aggregator("krum")(lambda *a: None)
    with pytest.raises(RuntimeError, match="registered twice"):
        attacks.model_attack("ipm")(lambda *a: None)


def test_a_registered_model_attack_replaces_the_attackers_updates():
    package = RoundPackage(0, torch.tensor([1.0, 1.0]), [0, 1, 2], shared=torch.tensor([True, False]))
    bad = [ClientUpdate(0, 1, 1, torch.tensor([3.0, 5.0]), 0.0)]
    good = [ClientUpdate(1, 1, 1, torch.tensor([2.0, 1.0]), 0.0), ClientUpdate(2, 1, 1, torch.tensor([4.0, 1.0]), 0.0)]
    (malicious,) = attacks.MODEL_ATTACKS["ipm"](make_args("FedAvg", attack_epsilon=0.5), package, bad, good)
    assert torch.equal(malicious, torch.tensor([-1.0, 0.0]))  # -0.5 x the benign mean update (2, 0)
