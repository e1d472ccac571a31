"""Text models: last-token reading, padding, integer inputs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from flcore.trainmodel.text import last_token_index
from modelcases import TEXT_ARGS, build, CASES


def test_last_token_index_ignores_right_padding():
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 0, 7, 8, 9], [0, 0, 0, 0, 0], [3, 0, 0, 0, 0]])
    assert last_token_index(ids).tolist() == [2, 4, 0, 0]


def test_lstm_reads_what_a_packed_lstm_computes_at_each_last_token():
    """PFLlib packs the padded batch; the output at a sequence's last token is the same without
    packing (the LSTM is causal), which is what our LSTM classifies."""
    torch.manual_seed(0)
    model = build("LSTM").eval()
    body = model.body
    ids = torch.randint(1, TEXT_ARGS.vocab_size, (4, 16))
    lengths = torch.tensor([16, 9, 3, 1])
    for row, length in enumerate(lengths):
        ids[row, length:] = 0
    with torch.no_grad():
        packed = nn.utils.rnn.pack_padded_sequence(body.embedding(ids), lengths, batch_first=True, enforce_sorted=False)
        _, (hidden, _) = body.lstm(packed)  # hidden[-1]: the top layer's state at each last token
        assert torch.allclose(body(ids), torch.relu(hidden[-1]), atol=1e-6)


@pytest.mark.parametrize("name", ["LSTM", "fastText", "TextCNN"])
def test_padding_embeddings_stay_zero_and_untrained(name):
    model = build(name)
    embedding = model.body.embedding
    assert embedding.padding_idx == 0 and embedding.weight[0].abs().sum() == 0
    ids = torch.tensor([[4, 5, 0, 0], [7, 0, 0, 0]]).repeat(1, 4)
    model(ids).sum().backward()
    assert embedding.weight.grad[0].abs().sum() == 0


def test_lstm_output_does_not_depend_on_what_follows_the_last_token():
    torch.manual_seed(0)
    model = build("LSTM").eval()
    ids = torch.randint(1, TEXT_ARGS.vocab_size, (2, 16))
    ids[:, 10:] = 0
    longer_padding = torch.cat([ids, torch.zeros(2, 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(ids), model(longer_padding), atol=1e-6)


@pytest.mark.parametrize("name", ["LSTM", "BiLSTM", "fastText", "TextCNN", "Transformer"])
def test_float_inputs_are_refused_with_a_clear_message(name):
    model = build(name)
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.zeros(2, *CASES[name].input_shape))


def test_textcnn_needs_five_tokens_and_transformer_eight_heads():
    with pytest.raises(ValueError, match="at least 5 tokens"):
        build("TextCNN", CASES["TextCNN"]._replace(input_shape=(4,)))
    from argparse import Namespace

    from flcore.registry import MODELS

    with pytest.raises(ValueError, match="divisible by 8"):
        MODELS.get("Transformer")((16,), 4, Namespace(vocab_size=100, feature_dim=30, max_len=16))


def test_the_models_own_defaults_are_the_flags_defaults():
    """Text models built without flags use PFLlib's -vs and -fd, as the command line declares them
    (the model code does not import the command-line module)."""
    from flcore.trainmodel import text
    from cli.flags import generic_parser

    defaults = generic_parser().parse_args([])
    assert text.PFLLIB_VOCAB_SIZE == defaults.vocab_size or defaults.vocab_size is None
    assert text.PFLLIB_FEATURE_DIM == defaults.feature_dim
    from cli.flags import PFLLIB_VOCAB_SIZE
    assert text.PFLLIB_VOCAB_SIZE == PFLLIB_VOCAB_SIZE
