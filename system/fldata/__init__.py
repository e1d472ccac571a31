"""The federated dataset: loading every layout (PFLlib's per-client npz files, the packed one) with its
checks (`loading`), and the server's public set (`public`)."""
