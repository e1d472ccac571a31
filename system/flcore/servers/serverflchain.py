"""FLChain (Majeed & Hong, APNOMS 2019, "FLchain: Federated Learning via MEC-enabled Blockchain
Network"), as the PFLlib slides give it (their Algorithm 1): FedAvg whose global model lives on a
chain kept by edge nodes.

* **Channels.** A channel is set up per global model; every device inquires the channels,
  registers to one and downloads its global model. This platform trains one global model, so
  there is one channel, ``global``, and every client registers to it: the genesis block records
  the registrations, the edge nodes, the quorum and the initial model's hash.
* **Transactions.** Each uploaded local model is a transaction (client, samples, sha256 of the
  model's bytes) in the round's pool, ordered by client: the canonical order every node sums in,
  so honest nodes compute the same aggregate to the last bit.
* **Edge nodes and consensus.** ``--flchain_nodes M`` edge nodes each aggregate the pool (FedAvg's
  sample-weighted mean) and propose the sha256 of their aggregate; a block is committed when a
  quorum (``--flchain_quorum``, default the majority ⌊M/2⌋ + 1) proposed the same hash. Honest
  nodes run one deterministic function on one pool, so the simulation computes it once and every
  honest node proposes its hash. ``--flchain_malicious k`` nodes (drawn from the seed) collude on
  a wrong aggregate, the honest step reversed (2·w(t) − w_honest; w_honest + 1 when the step is
  zero): they are outvoted, named in the block and in a log line, and counted in
  ``rs_outvoted_nodes``. A quorum larger than M, or honest nodes fewer than the quorum (the wrong
  block could win or none be committed), is refused in one line, exit status 2.
* **The ledger.** Blocks are hash-linked lines (``ledger.py``): each round's block holds its
  transactions, every node's proposal, the committed model hash, the agreeing and outvoted nodes
  and its virtual times. The chain is part of the server's state, so a checkpoint keeps it and
  ``--resume`` continues it; it is written with the finished results as ``<run>.ledger``, beside
  the ``.h5`` and the model, under a temporary name renamed into place with them.
  ``python ledger.py verify results/<run>.ledger`` re-checks it.
* **Time.** On the virtual clock (``features/clock.py``) a round lasts its training and uploads as
  in FedAvg, then the consensus: the pool reaches the edge nodes (its bytes over
  ``--flchain_node_bandwidth``) and two messages between nodes (proposal, vote) take
  ``--flchain_latency`` each; then block generation takes ``--flchain_block_time``. Series
  ``rs_consensus_time`` and ``rs_block_time``; the round ends when its block is committed, so
  ``rs_virtual_time`` and ``rs_virtual_round_time`` include both (``VirtualClock.extend_round``).
* **Stopping rule.** The slides stop when ‖w(t) − w(t−1)‖₂ < ε: ``--flchain_epsilon ε`` (0, the
  default, never stops early; -gr bounds the run). ``rs_model_change`` records the norm per round.

With every node honest the committed model is FedAvg's, bit for bit (the test compares them).
Local training is FedAvg's (the slides' V local iterations are -ls epochs of -lbs batches).
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser
from pathlib import Path
from typing import Callable, Sequence

import torch

import ledger
from flcore.clients.clientfedavg import FedAvgClient
from flcore.protocol import ClientUpdate, RoundPackage, RoundResult
from flcore.registry import register_algorithm
from flcore.servers.serverbase import Server, weighted_average
from cli.flags import add_flag
from utils.errors import FLError
from utils.seeding import numpy_rng

log = logging.getLogger("fl")

CHANNEL = "global"


def model_sha256(params: torch.Tensor) -> str:
    """sha256 of the exact bytes of a flat model (float32, as the ledger's verifier rebuilds it)."""
    flat = params.detach().to("cpu", torch.float32).contiguous()
    return ledger.sha256_hex(flat.numpy().tobytes())


def wrong_aggregate(previous: torch.Tensor, honest: torch.Tensor) -> torch.Tensor:
    """What a malicious node proposes: the honest step reversed (a different model whenever the
    honest step moved the model; otherwise the honest aggregate shifted by one)."""
    reversed_step = 2 * previous - honest
    return reversed_step if not torch.equal(reversed_step, honest) else honest + 1


@register_algorithm("FLChain")
class FLChain(Server):
    """FedAvg committed through a quorum of edge nodes to a hash-linked ledger (module docstring)."""

    #: what persists across rounds (checkpoints): the chain so far and the last round's model change
    carried = ("ledger_lines", "model_change")

    client_cls = FedAvgClient

    @classmethod
    def add_args(cls, parser: ArgumentParser) -> None:
        add_flag(parser, "--flchain_nodes", type=int, default=5, low=1, help="FLChain: edge nodes that aggregate and vote")
        add_flag(parser, "--flchain_malicious", type=int, default=0, low=0,
                 help="FLChain: edge nodes (drawn from the seed) that propose a wrong aggregate")
        add_flag(parser, "--flchain_quorum", type=int, default=0, low=0,
                 help="FLChain: agreeing nodes a block needs (0: the majority floor(M/2) + 1)")
        add_flag(parser, "--flchain_epsilon", type=float, default=0.0, low=0,
                 help="FLChain: stop once ||w(t) - w(t-1)||_2 < epsilon (0: never stop early)")
        add_flag(parser, "--flchain_block_time", type=float, default=1.0, low=0,
                 help="FLChain: virtual seconds to generate a block")
        add_flag(parser, "--flchain_latency", type=float, default=0.05, low=0,
                 help="FLChain: virtual seconds of one message between edge nodes (consensus takes two)")
        add_flag(parser, "--flchain_node_bandwidth", type=float, default=1e8, above=0,
                 help="FLChain: bytes per virtual second by which the transaction pool reaches the edge nodes")

    def setup(self) -> None:
        nodes, bad = self.hp.flchain_nodes, self.hp.flchain_malicious
        self.quorum = self.hp.flchain_quorum or ledger.majority(nodes)
        if self.quorum > nodes:
            raise FLError(f"FLChain has {nodes} edge node(s), fewer than its quorum of {self.quorum}; "
                          f"pass --flchain_nodes {self.quorum} or more, or a smaller --flchain_quorum")
        if 2 * self.quorum <= nodes:
            raise FLError(f"--flchain_quorum {self.quorum} of {nodes} nodes is no majority (two blocks could both "
                          f"reach it); pass --flchain_quorum {ledger.majority(nodes)} or more")
        if nodes - bad < self.quorum:
            raise FLError(f"FLChain: {nodes - bad} honest edge node(s) cannot reach the quorum of {self.quorum} "
                          f"(--flchain_malicious {bad} of --flchain_nodes {nodes}); pass fewer malicious nodes or more nodes")
        drawn = numpy_rng(self.args.seed, "flchain-malicious").choice(nodes, size=bad, replace=False)
        self.malicious_nodes = sorted(int(n) for n in drawn)
        #: the chain so far, one sealed line a block (ledger.py); checkpointed with the server
        self.ledger_lines: list[str] = []
        ledger.append_block(self.ledger_lines, {
            "kind": "genesis", "format": ledger.FORMAT, "version": ledger.VERSION, "channel": CHANNEL,
            "devices": [int(c.cid) for c in self.dataset.clients], "nodes": nodes, "quorum": self.quorum,
            "malicious": self.malicious_nodes,
            "layout": [[s.name, s.stop - s.start] for s in self.model.segments],
            "model_sha256": model_sha256(self.global_params),
        })
        self.model_change = float("inf")
        self.chain_seconds = 0.0  # the consensus and block time of the round under way

    def summary(self) -> dict[str, object]:
        return {"nodes": self.hp.flchain_nodes, "quorum": self.quorum, "malicious_nodes": self.malicious_nodes,
                "epsilon": self.hp.flchain_epsilon}

    def aggregate(self, updates: list[ClientUpdate], package: RoundPackage) -> None:
        pool = sorted(updates, key=lambda u: u.index)  # the canonical order every node sums in
        previous = self.global_params
        honest = weighted_average(pool)
        candidates = {model_sha256(honest): honest}
        wrong_hash = None
        if self.malicious_nodes:
            wrong = wrong_aggregate(previous, honest)
            wrong_hash = model_sha256(wrong)
            candidates[wrong_hash] = wrong
        honest_hash = next(iter(candidates))
        proposals = [wrong_hash if node in self.malicious_nodes else honest_hash for node in range(self.hp.flchain_nodes)]
        committed, agreeing, outvoted = ledger.decide(proposals, self.quorum)
        if committed is None:  # pragma: no cover - setup refuses settings where honest nodes miss the quorum
            raise FLError(f"FLChain: no aggregate reached the quorum of {self.quorum} in round {package.round}")
        if outvoted:
            log.info("flchain: round %d, edge node(s) %s proposed another aggregate and were outvoted",
                     package.round, ", ".join(map(str, outvoted)))
        self.global_params = candidates[committed]
        self.model_change = float(torch.linalg.vector_norm((self.global_params - previous).double()))
        pool_bytes = sum(u.nbytes() for u in pool)
        consensus = pool_bytes / self.hp.flchain_node_bandwidth + 2 * self.hp.flchain_latency
        self.chain_seconds = consensus + self.hp.flchain_block_time  # the round ends when its block is committed
        ledger.append_block(self.ledger_lines, {
            "kind": "round", "channel": CHANNEL, "round": int(package.round),
            "transactions": [{"client": int(self.clients[u.index].data.cid), "samples": int(u.num_samples),
                              "model_sha256": model_sha256(u.params)} for u in pool],
            "proposals": proposals, "model_sha256": committed, "agreeing": agreeing, "outvoted": outvoted,
            "consensus_seconds": consensus, "block_seconds": self.hp.flchain_block_time,
            "virtual_time": self.virtual_time + self.chain_seconds,
        })
        history = self.history
        history.add_series("consensus_time", consensus)
        history.add_series("block_time", self.hp.flchain_block_time)
        history.add_series("outvoted_nodes", len(outvoted))
        history.add_series("model_change", self.model_change)

    def run_round(self, rnd: int, evaluate: bool = True, train: bool = True,
                  cohort: list[int] | None = None) -> RoundResult:
        """The base round, then the consensus and the block on the virtual clock."""
        self.chain_seconds = 0.0
        result = super().run_round(rnd, evaluate, train, cohort)
        if self.chain_seconds:
            self.plugin("clock").extend_round(self.chain_seconds, result)
        return result

    def train(self, progress: bool = True, callbacks: Sequence[Callable] = (), **kwargs):
        """The base loop with the slides' stopping rule as one more callback."""
        return super().train(progress, [*callbacks, self.converged], **kwargs)

    def converged(self, server: Server, result) -> str | bool:
        epsilon = self.hp.flchain_epsilon
        if result.trained and result.updates and self.model_change < epsilon:
            return f"FLChain's stopping rule: ||w(t) - w(t-1)|| = {self.model_change:.3g} < --flchain_epsilon {epsilon:g}"
        return False

    def result_files(self, result: Path) -> dict[Path, Callable[[str], None]]:
        """The chain, written beside the results as ``<run>.ledger``."""
        data = ledger.ledger_bytes(self.ledger_lines)
        return {result.with_suffix(".ledger"): lambda tmp: Path(tmp).write_bytes(data)}
