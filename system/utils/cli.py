"""Command-line flags of ``main.py``: PFLlib's names and defaults, booleans that switch both ways.

Every long PFLlib flag (``--global_rounds``) also accepts the dashed spelling
(``--global-rounds``). PFLlib declares booleans with ``type=bool``, so ``-ab False`` turns
auto-break *on*; here ``-ab``, ``-ab True`` and ``-ab 1`` turn it on and ``-ab False`` /
``-ab 0`` off. Algorithm flags are not declared here: each algorithm file declares its own and
``main.py`` adds only those of the selected algorithm (and of the selection policy).
"""
from __future__ import annotations

import argparse
from typing import Any


def str2bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in {"1", "true", "t", "yes", "y", "on"}:
        return True
    if lowered in {"0", "false", "f", "no", "n", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False/1/0), got {value!r}")


def add_flag(parser: argparse.ArgumentParser | Any, *names: str, **kwargs: Any) -> None:
    """``add_argument`` that also registers ``--dashed-name`` for each ``--underscored_name``."""
    spellings = list(names)
    for name in names:
        if name.startswith("--") and "_" in name:
            dashed = name.replace("_", "-")
            if dashed not in spellings:
                spellings.append(dashed)
    if kwargs.get("type") is bool:
        kwargs.update(type=str2bool, nargs="?", const=True, metavar="BOOL")
    parser.add_argument(*spellings, **kwargs)


def generic_parser() -> argparse.ArgumentParser:
    """The flags every run has (PFLlib's generic flags plus ours)."""
    parser = argparse.ArgumentParser(
        prog="main.py",
        description="Federated-learning simulation (PFLlib-compatible command line).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    g = parser.add_argument_group("general (PFLlib)")
    add_flag(g, "-go", "--goal", type=str, default="test", help="experiment tag, part of the result file name")
    add_flag(g, "-dev", "--device", type=str, default="cuda", choices=["cpu", "cuda"],
             help="cuda falls back to cpu with a warning when no GPU is available")
    add_flag(g, "-did", "--device_id", type=str, default="0", help="GPU index used with -dev cuda")
    add_flag(g, "-data", "--dataset", type=str, default="MNIST", help="folder under dataset/ (or a path)")
    add_flag(g, "-ncl", "--num_classes", type=int, default=None,
             help="number of classes; read from config.json (an explicit value must match it)")
    add_flag(g, "-m", "--model", type=str, default="CNN", help="model name (see the model registry)")
    add_flag(g, "-lbs", "--batch_size", type=int, default=10, help="local minibatch size B")
    add_flag(g, "-lr", "--local_learning_rate", type=float, default=0.005, help="client SGD learning rate η")
    add_flag(g, "-ld", "--learning_rate_decay", type=bool, default=False,
             help="decay each client's lr by -ldg after every local training call")
    add_flag(g, "-ldg", "--learning_rate_decay_gamma", type=float, default=0.99, help="lr decay factor")
    add_flag(g, "-gr", "--global_rounds", type=int, default=2000, help="communication rounds")
    add_flag(g, "-tc", "--top_cnt", type=int, default=100, help="auto-break patience in evaluations")
    add_flag(g, "-ls", "--local_epochs", type=int, default=1, help="local epochs E per round")
    add_flag(g, "-algo", "--algorithm", type=str, default="FedAvg", help="algorithm name (see the list below)")
    add_flag(g, "-jr", "--join_ratio", type=float, default=1.0, help="fraction of clients selected per round, in (0, 1]")
    add_flag(g, "-rjr", "--random_join_ratio", type=bool, default=False,
             help="draw the cohort size uniformly from [nc*jr, nc] every round")
    add_flag(g, "-nc", "--num_clients", type=int, default=None,
             help="number of clients; read from config.json (an explicit value must match it)")
    add_flag(g, "-pv", "--prev", type=int, default=0, help="index of the first repeated run")
    add_flag(g, "-t", "--times", type=int, default=1, help="number of repeated runs (seeds seed+run)")
    add_flag(g, "-eg", "--eval_gap", type=int, default=1, help="evaluate every eg rounds")
    add_flag(g, "-sfn", "--save_folder_name", type=str, default="items", help="accepted for PFLlib compatibility; the final global model goes to system/models/<data>/")
    add_flag(g, "-ab", "--auto_break", type=bool, default=False, help="stop when the best accuracy is -tc evaluations old")
    add_flag(g, "-dlg", "--dlg_eval", type=bool, default=False, help="DLG privacy attack (not supported)")
    add_flag(g, "-dlgg", "--dlg_gap", type=int, default=100, help="DLG every dlgg rounds (not supported)")
    add_flag(g, "-bnpc", "--batch_num_per_client", type=int, default=2, help="batches per client for DLG")
    add_flag(g, "-nnc", "--num_new_clients", type=int, default=0, help="new clients evaluated after training (not supported)")
    add_flag(g, "-ften", "--fine_tuning_epoch_new", type=int, default=0, help="fine-tuning epochs on new clients")
    add_flag(g, "-fd", "--feature_dim", type=int, default=512, help="feature/embedding dimension of text models")
    add_flag(g, "-vs", "--vocab_size", type=int, default=80, help="vocabulary size of text models")
    add_flag(g, "-ml", "--max_len", type=int, default=200, help="text length")
    add_flag(g, "-fs", "--few_shot", type=int, default=0, help="if > 0 keep at most fs training samples per label per client")

    p = parser.add_argument_group("practical (system heterogeneity, PFLlib)")
    add_flag(p, "-cdr", "--client_drop_rate", type=float, default=0.0, help="fraction of uploads dropped each round")
    add_flag(p, "-tsr", "--train_slow_rate", type=float, default=0.0,
             help="fraction of clients that are slow trainers (they run 1..E//2 epochs)")
    add_flag(p, "-ssr", "--send_slow_rate", type=float, default=0.0, help="slow senders (not supported)")
    add_flag(p, "-ts", "--time_select", type=bool, default=False, help="time-based selection (not supported)")
    add_flag(p, "-tth", "--time_threthold", type=float, default=10000, help="time threshold (not supported)")

    o = parser.add_argument_group("platform")
    add_flag(o, "--seed", type=int, default=0, help="seed of the run; run i of -t uses seed + i")
    add_flag(o, "--engine", type=str, default="auto",
             help="training engine: auto (batched on a GPU, threaded on a multi-core CPU, else sequential), "
                  "sequential, threaded, batched")
    add_flag(o, "--select", type=str, default="uniform", help="client selection policy")
    add_flag(o, "--state_device", type=str, default="auto",
             help="where per-client state lives: auto (the compute device; on a GPU, new vectors go to the "
                  "CPU once it would keep less than 25%% of its memory), cpu, cuda, or disk (anonymous files "
                  "under --state_dir: memory stops growing with the number of clients)")
    add_flag(o, "--state_dir", type=str, default=None,
             help="directory of the --state_device disk files (default: the system's temporary directory)")
    add_flag(o, "--state_dtype", type=str, default="float32", choices=["float32", "float16", "bfloat16"],
             help="storage dtype of per-client state vectors (control variates, personal models); float16 "
                  "halves their memory, rounding what persists between participations to 11 significant bits")
    add_flag(o, "--num_threads", type=int, default=0,
             help="torch CPU threads (0 = torch's default); 1 is often fastest for small models on a busy machine")
    add_flag(o, "--compact_inputs", type=bool, default=True,
             help="hold inputs with at most 256 distinct values (8-bit images) as uint8 codes plus a table of "
                  "their float values: a quarter of the memory, decoded per batch to the same floats")
    add_flag(o, "--eval_batch_size", type=int, default=128,
             help="batch size of evaluation passes (128: fastest measured for the CNNs with channels-last on a CPU)")
    add_flag(o, "--eval_group", type=int, default=0,
             help="personal models evaluated at once under torch.func.vmap (personalised algorithms): 0 = auto "
                  "(one by one on a CPU, where that is fastest; on a GPU as many as fit a quarter of its free "
                  "memory), 1 = one by one, N = N at a time; results differ only by float rounding")
    add_flag(o, "--conv_layout", type=str, default="auto", choices=["auto", "nchw", "channels_last"],
             help="memory layout of 2-d convolutions: auto (channels_last on the CPU, where oneDNN is 1.3-3x "
                  "faster with it, nchw on GPUs); results differ only by float rounding")
    add_flag(o, "--eval_auc", type=bool, default=True, help="compute the micro-AUC at every evaluation")
    add_flag(o, "--eval_train_loss", type=bool, default=True, help="evaluate the train loss over all clients' train data")
    add_flag(o, "--drop_last", type=bool, default=True, help="skip a trailing partial local batch (PFLlib)")
    add_flag(o, "--avg_last", type=int, default=10, help="report the mean accuracy of the last N evaluations")
    add_flag(o, "--target_acc", type=float, default=None, help="report the round and traffic to reach this accuracy")
    add_flag(o, "--results_dir", type=str, default=None, help="where h5 results go (default <repo>/results)")
    add_flag(o, "--data_root", type=str, default=None, help="folder holding datasets (default <repo>/dataset)")
    add_flag(o, "--legacy_pickle", type=bool, default=False,
             help="allow PFLlib's pickled npz files (unsafe: unpickling can run code from the file)")
    add_flag(o, "--save_model", type=bool, default=True, help="save the final global model (state_dict)")
    add_flag(o, "--progress", type=bool, default=True, help="show a progress bar over rounds")
    add_flag(o, "-q", "--quiet", type=bool, default=False, help="only print the summary")
    return parser
