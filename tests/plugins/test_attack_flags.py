"""Attack and defence flags that would change nothing are refused in one line before any data is read;
attacker counts keep a benign client and say when they hold no attacker; names in any case."""
from __future__ import annotations

import logging

import pytest

import main
from fltest import build_server, make_args, random_dataset
from utils.errors import FLError


@pytest.mark.parametrize("flags, words", [
    (["--attack", "sign_flip"], "--attack sign_flip needs --attack_fraction"),
    (["--attack_scale", "3"], "--attack_scale acts on --attack, which is not given"),
    (["--backdoor_target", "1", "--attack_resample"], "--attack_resample, --backdoor_target act on --attack"),
    (["--robust_clip", "1.5"], "--robust_clip acts on --robust, which is not given"),
    (["--attack", ""], "--attack '' names no attack"),
    (["--robust", " "], "--robust '' names no defence"),
    (["--robust", "krumm"], "unknown defence 'krumm'"),
    (["--attack", "signflip", "--attack_fraction", "0.2"], "--attack signflip: unknown attack"),
])
def test_flags_that_change_nothing_are_one_line_before_any_data(flags, words, capsys):
    assert main.main(["-data", "/nonexistent", "-dev", "cpu", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err, err


def test_names_are_read_in_any_case():
    args = make_args("FedAvg", "--attack", "SIGN_FLIP", "--attack_fraction", "0.2", "--robust", "Clip,KRUM")
    assert (args.attack, args.robust) == ("sign_flip", "clip,krum")


def test_a_fraction_that_leaves_no_benign_client_is_refused():
    data = random_dataset(num_clients=6, dim=3, num_classes=3)
    with pytest.raises(FLError, match=r"makes all 6 clients attackers, which leaves no benign client; pass "
                                      r"--attack_fraction below 0\.9167"):
        build_server(make_args("FedAvg", attack="sign_flip", attack_fraction=0.99, num_clients=6), data)
    assert build_server(make_args("FedAvg", attack="sign_flip", attack_fraction=0.9, num_clients=6), data)  # 5 of 6


def test_a_fraction_that_rounds_to_no_attacker_says_so(caplog):
    data = random_dataset(num_clients=6, dim=3, num_classes=3)
    with caplog.at_level(logging.WARNING, logger="fl"):
        server = build_server(make_args("FedAvg", attack="sign_flip", attack_fraction=1e-9, num_clients=6), data)
    assert "makes round(1e-09 x 6) = 0 of the clients attackers: this run is clean" in caplog.text
    assert not server.plugin("attack").attackers(0).any()


@pytest.mark.parametrize("algorithm, uploads", [("FedProto", "class prototypes"), ("FD", "per-class mean logits"),
                                                ("Local", "nothing"), ("pFedEff", "sparse, masked messages")])
def test_model_poisoning_of_algorithms_that_upload_no_weights_is_refused(algorithm, uploads):
    """Their uploads carry no weights for sign_flip to flip: accepted, such a run equalled the clean one and an
    attack table showed it perfectly robust."""
    data = random_dataset(num_clients=4, dim=3, num_classes=3)
    with pytest.raises(FLError, match=f"--attack sign_flip poisons the model weights clients upload, and {algorithm}'s "
                                      f"clients upload {uploads} instead; use a data-poisoning attack"):
        build_server(make_args(algorithm, attack="sign_flip", attack_fraction=0.25, num_clients=4), data)
