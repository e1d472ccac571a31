"""PFLlib's text classifiers: ``LSTM``, ``BiLSTM``, ``fastText``, ``TextCNN``, ``Transformer``; and
TFF's bag-of-words logistic regression for multi-label tag prediction, ``BoWLR``.

Inputs are int64 token ids ``[N, L]``, right-padded with id 0 (PFLlib's ``padding_idx=0``); the
dataset's ``input_shape`` is ``[L]``. The sizes follow PFLlib's ``main.py``: vocabulary ``-vs``
(``args.vocab_size``), embedding and hidden width ``-fd`` (``args.feature_dim``); the sequence
length is the data's ``L`` (PFLlib's ``-ml``, ``args.max_len``, must equal it there; here the
models adapt to ``L`` and ``-ml`` only matters to the dataset generators). ``head`` is the final
linear classifier. Every model returns logits (PFLlib's return log-softmax, which gives the same
cross-entropy).

PFLlib feeds ``(token ids, lengths)`` pairs; here a sequence's length is the position of its last
non-padding token plus one (at least 1), computed from the ids.

Deliberate differences from PFLlib, besides returning logits:

* ``LSTM``: PFLlib packs the sequences and then classifies ``output[:, -1]`` of the re-padded
  output, which is all zeros for every sequence shorter than the longest of its batch (so those
  are classified from the bias alone). Here the classifier sees the output at each sequence's own
  last token: what packing computes for it, without packing (the LSTM is causal, so padding
  after the last token cannot change that output).
* ``BiLSTM`` (FedNLP's ``BiLSTM_TextClassification`` with PFLlib's arguments: one layer, no
  attention, dropout 0): as FedNLP, it runs over the padded sequence and reads the output at the
  last token; its initial states are created on the input's device (FedNLP hard-codes CUDA).
* ``Transformer``: the sinusoidal position table is computed for the input's length on use
  rather than stored as a buffer (PFLlib's ``pe`` buffer would travel in the flat model vector and
  be averaged); as in PFLlib there is no padding mask.
"""
from __future__ import annotations

import math
from argparse import Namespace
from typing import Sequence

import torch
from torch import nn

from flcore.registry import register_model
from flcore.trainmodel.models import SplitModel

PADDING_ID = 0
#: PFLlib's defaults of -vs and -fd, for a model built without flags (cli/flags.py declares the
#: flags with the same values; tests/models/test_text_models.py checks that they agree)
PFLLIB_VOCAB_SIZE = 80
PFLLIB_FEATURE_DIM = 512


def text_options(name: str, input_shape: Sequence[int], args: Namespace | None) -> tuple[int, int, int]:
    """(vocabulary size, feature width, sequence length) for text model ``name``; PFLlib's flag
    defaults (``-vs 80 -fd 512``) when no arguments are given."""
    if len(input_shape) != 1:
        raise ValueError(f"{name} needs token-id inputs [sequence length], got {list(input_shape)}")
    # -vs unset: main.build_model fills in config.json's vocab_size; a bare factory call gets PFLlib's.
    vocab_size = None if args is None else args.vocab_size
    vocab = int(vocab_size if vocab_size is not None else PFLLIB_VOCAB_SIZE)
    width = int(PFLLIB_FEATURE_DIM if args is None else args.feature_dim)
    length = int(input_shape[0])
    if vocab < 1 or width < 1 or length < 1:
        raise ValueError(f"{name} needs -vs, -fd and the sequence length >= 1, got {vocab}, {width}, {length}")
    return vocab, width, length


def check_token_ids(name: str, x: torch.Tensor) -> None:
    if x.is_floating_point() or x.dim() != 2:
        raise ValueError(f"{name} takes integer token ids [N, L], got {x.dtype} inputs of shape {list(x.shape)}")


def last_token_index(ids: torch.Tensor) -> torch.Tensor:
    """Position of each row's last non-padding token ([N] int64; 0 for an all-padding row)."""
    positions = torch.arange(1, ids.shape[1] + 1, device=ids.device)
    return ((ids != PADDING_ID) * positions).amax(dim=1).clamp(min=1) - 1


def at_positions(sequence: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``sequence[i, index[i]]`` for a [N, L, D] tensor: [N, D]."""
    return sequence.gather(1, index.view(-1, 1, 1).expand(-1, 1, sequence.shape[2])).squeeze(1)


class LSTMBody(nn.Module):
    """Embedding -> (Bi)LSTM -> the output at each sequence's last token [-> ReLU] [-> dropout]."""

    def __init__(self, name: str, vocab: int, width: int, layers: int, bidirectional: bool, dropout: float,
                 padding_idx: int | None, relu: bool):
        super().__init__()
        self.name = name
        self.embedding = nn.Embedding(vocab, width, padding_idx=padding_idx)
        self.lstm = nn.LSTM(width, width, num_layers=layers, bidirectional=bidirectional,
                            dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.activation = nn.ReLU() if relu else nn.Identity()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.out_features = width * (2 if bidirectional else 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(self.name, ids)
        output, _ = self.lstm(self.embedding(ids))
        return self.dropout(self.activation(at_positions(output, last_token_index(ids))))


@register_model("LSTM")
def lstm(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's LSTMNet: embedding (``-fd``, padding id 0), two-layer LSTM of width ``-fd`` with
    dropout 0.2 between layers, ReLU and dropout 0.2 on the last token's output, linear classifier."""
    vocab, width, _ = text_options("LSTM", input_shape, args)
    body = LSTMBody("LSTM", vocab, width, layers=2, bidirectional=False, dropout=0.2, padding_idx=PADDING_ID, relu=True)
    return SplitModel(body, nn.Linear(body.out_features, num_classes))


@register_model("BiLSTM")
def bilstm(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """FedNLP's BiLSTM text classifier with PFLlib's arguments: embedding of width ``-fd`` (no
    padding index), one bidirectional LSTM layer of width ``-fd``, both directions' outputs at the
    last token, linear classifier (input 2 x ``-fd``); no attention, no dropout."""
    vocab, width, _ = text_options("BiLSTM", input_shape, args)
    body = LSTMBody("BiLSTM", vocab, width, layers=1, bidirectional=True, dropout=0.0, padding_idx=None, relu=False)
    return SplitModel(body, nn.Linear(body.out_features, num_classes))


class FastTextBody(nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width, padding_idx=PADDING_ID)
        self.hidden = nn.Linear(width, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("fastText", ids)
        return self.hidden(self.embedding(ids).mean(dim=1))


@register_model("fastText")
def fasttext(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's fastText (Joulin et al., EACL 2017): the mean of the word embeddings (``-fd``, over
    all L positions including padding, whose embedding is zero: PFLlib's choice), a linear hidden
    layer of width ``-fd`` without activation, linear classifier."""
    vocab, width, _ = text_options("fastText", input_shape, args)
    return SplitModel(FastTextBody(vocab, width), nn.Linear(width, num_classes))


class TextCNNBody(nn.Module):
    def __init__(self, vocab: int, width: int, channels: int, kernels: Sequence[int], dropout: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width, padding_idx=PADDING_ID)
        self.convs = nn.ModuleList(nn.Conv1d(width, channels, k) for k in kernels)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.out_features = channels * len(kernels)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("TextCNN", ids)
        embedded = self.embedding(ids).transpose(1, 2)  # [N, width, L]: Conv1d's channels first
        # max over time of each filter (PFLlib's MaxPool1d(max_len - k + 1) when L == max_len)
        pooled = [self.relu(conv(embedded)).amax(dim=2) for conv in self.convs]
        return self.dropout(torch.cat(pooled, dim=1))


#: Kim (EMNLP 2014) and PFLlib: 100 filters of each width 3, 4, 5
TEXTCNN_KERNELS = (3, 4, 5)


@register_model("TextCNN")
def textcnn(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's TextCNN (Kim 2014): embedding (``-fd``, padding id 0), 100 filters of widths 3, 4, 5
    with ReLU and max-over-time pooling, dropout 0.8 (PFLlib's value; Kim used 0.5), linear
    classifier on the 300 features. Sequences must be at least 5 tokens long."""
    vocab, width, length = text_options("TextCNN", input_shape, args)
    if length < max(TEXTCNN_KERNELS):
        raise ValueError(f"TextCNN needs sequences of at least {max(TEXTCNN_KERNELS)} tokens, got {length}")
    body = TextCNNBody(vocab, width, channels=100, kernels=TEXTCNN_KERNELS, dropout=0.8)
    return SplitModel(body, nn.Linear(body.out_features, num_classes))


def sinusoidal_positions(length: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Vaswani et al.'s position encoding [length, width]: sin on even, cos on odd features."""
    position = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, width, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width, device=device, dtype=torch.float32)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return table.to(dtype)


class TransformerBody(nn.Module):
    """Scaled embedding + positions (dropout), a learned [CLS] token in front, a post-norm encoder;
    the [CLS] token's output is the feature."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, hidden: int, dropout: float):
        super().__init__()
        self.width = width
        self.embedding = nn.Embedding(vocab, width)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(width, heads, hidden, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self._positions: dict[tuple, torch.Tensor] = {}  # per (length, device, dtype): a cache, not state
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)  # PFLlib's init_weights

    def positions(self, length: int, like: torch.Tensor) -> torch.Tensor:
        key = (length, like.device, like.dtype)
        if key not in self._positions:
            self._positions[key] = sinusoidal_positions(length, self.width, like.device, like.dtype)
        return self._positions[key]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("Transformer", ids)
        scale = math.sqrt(self.width)
        x = self.embedding(ids) * scale
        x = self.dropout(x + self.positions(ids.shape[1], x))
        cls = self.class_token.expand(ids.shape[0], -1, -1) * scale
        return self.encoder(torch.cat([cls, x], dim=1))[:, 0]


@register_model("Transformer")
def transformer(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """PFLlib's TransformerModel: embedding of width ``-fd`` scaled by sqrt(``-fd``), sinusoidal
    positions, dropout 0.1, a [CLS] token, 2 encoder layers (8 heads, feed-forward 2048, dropout
    0.1, ReLU, post-norm), linear classifier on the [CLS] output (uniform(-0.1, 0.1) weights, zero
    bias, as PFLlib). ``-fd`` must be a multiple of 8 (the heads)."""
    vocab, width, _ = text_options("Transformer", input_shape, args)
    if width % 8:
        raise ValueError(f"Transformer's 8 attention heads need -fd divisible by 8, got {width}")
    head = nn.Linear(width, num_classes)
    nn.init.uniform_(head.weight, -0.1, 0.1)
    nn.init.zeros_(head.bias)
    return SplitModel(TransformerBody(vocab, width, heads=8, layers=2, hidden=2048, dropout=0.1), head)


class NormalisedBag(nn.Module):
    """The bag of words of each row of token ids as TFF's tag prediction builds it: the counts of
    word ids ``1 .. vocab - 2`` (the out-of-vocabulary id ``vocab - 1`` and padding 0 dropped),
    divided by

    * ``denominator="all"``: the row's number of non-padding ids, out-of-vocabulary ones included
      (a mean of one-hots over V + 1 entries, the last dropped): the rule of the code behind Reddi
      et al., "Adaptive Federated Optimization" (ICLR 2021; google-research/federated,
      ``utils/datasets/stackoverflow_lr_dataset.py``) and of TFF's baseline of that time;
    * ``denominator="vocabulary"``: the in-vocabulary words only (TFF's current
      ``tag_prediction_preprocessing.py`` divides the in-vocabulary counts by their sum).

    A row without a counted word gives zeros. Output ``[N, vocab - 2]``."""

    def __init__(self, vocab: int, denominator: str = "all"):
        super().__init__()
        if vocab < 3:
            raise ValueError(f"BoWLR needs a vocabulary of padding, words and an out-of-vocabulary id (-vs >= 3), got {vocab}")
        if denominator not in ("all", "vocabulary"):
            raise ValueError(f"BoWLR's denominator is all or vocabulary, got {denominator!r}")
        self.vocab, self.denominator = vocab, denominator
        self.out_features = vocab - 2

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("BoWLR", ids)
        counts = torch.zeros(*ids.shape[:-1], self.vocab, dtype=torch.float32, device=ids.device)
        counts = counts.scatter_add(-1, ids, torch.ones_like(ids, dtype=torch.float32))[..., 1:-1]
        if self.denominator == "all":
            length = (ids != PADDING_ID).sum(-1, keepdim=True).to(counts.dtype)
        else:
            length = counts.sum(-1, keepdim=True)
        return counts / length.clamp(min=1)


@register_model("BoWLR")
def bag_of_words_lr(input_shape: Sequence[int], num_classes: int, args: Namespace | None = None) -> SplitModel:
    """TFF's StackOverflow tag-prediction model: logistic regression, one dense layer from the
    normalised bag of words (:class:`NormalisedBag`) to a logit per tag
    (``tensorflow_federated/python/simulation/baselines/stackoverflow/tag_prediction_tasks.py``:
    ``Dense(tag_vocab_size, activation='sigmoid')``; the sigmoid is the multi-label objective's,
    flcore/objectives.py). Token ids as ``generate_StackOverflow.py --task tag`` writes them:
    ``-vs`` (config.json's ``vocab_size``) is the number of words + 2. ``--bow_denominator`` chooses
    which words a count is divided by (:class:`NormalisedBag`; default ``all``, the rule of the
    published results). Weights Glorot-uniform and bias zero, Keras' ``Dense`` initialisation."""
    vocab, _, _ = text_options("BoWLR", input_shape, args)
    denominator = getattr(args, "bow_denominator", None) or "all"
    body = NormalisedBag(vocab, denominator)
    head = nn.Linear(body.out_features, num_classes)
    nn.init.xavier_uniform_(head.weight)
    nn.init.zeros_(head.bias)
    return SplitModel(body, head)


bag_of_words_lr.own_flags = ("bow_denominator",)  # refused for other models (runner/model.py)
