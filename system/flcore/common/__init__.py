"""What several algorithms share and none owns: FedMA's matched averaging (`matching`), the per-class
means that travel instead of a model (`labelmeans`: FedProto, FD, FedGH, ...), and the masks and sparse
messages of the mask-based algorithms (`sparsemask`: pFedEff, LotteryFL, Hermes)."""
