"""The benchmark's printed table: seconds per round, samples per second, memory, and the ratios
between engines measured in the same run."""
from __future__ import annotations

import os
import platform
from pathlib import Path

from speedbench.configs import BASELINE, CONFIGS


def device_name(device: str) -> str:
    if device == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                return f"{torch.cuda.get_device_name(0)} (CUDA)"
        except Exception:  # noqa: BLE001
            pass
        return "cuda requested, no GPU visible (cpu)"
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs"


def fmt(value, spec=".2f", none="-") -> str:
    return none if value is None else format(value, spec)


def _ratio_lines(results: list[dict], names: list[str], interleaved: bool) -> list[str]:
    by = {(r["config"], r["engine"]): r for r in results if "error" not in r and r.get("interleaved", False) == interleaved}
    lines = []
    tag = "interleaved" if interleaved else "separate runs"
    present = list(dict.fromkeys(r["engine"] for r in results))
    ours = [e for e in present if e not in ("sequential", BASELINE)]
    for name in names:
        seq = by.get((name, "sequential"))
        for engine in ours:
            other = by.get((name, engine))
            if not (seq and other and seq["s_per_round"] and other["s_per_round"]):
                continue
            line = (f"  {name} {engine}/sequential ({tag}): s/round {other['s_per_round'] / seq['s_per_round']:.2f} "
                    f"(speed-up {seq['s_per_round'] / other['s_per_round']:.2f}x), training "
                    f"{other['train_s_per_round'] / seq['train_s_per_round']:.2f} "
                    f"(speed-up {seq['train_s_per_round'] / other['train_s_per_round']:.2f}x), CPU s/round "
                    f"{other['cpu_s_per_round'] / seq['cpu_s_per_round']:.2f}")
            if not interleaved:
                line += f", peak RSS {other['peak_rss_mb'] / seq['peak_rss_mb']:.2f}"
            if seq.get("final_test_acc") is not None and other.get("final_test_acc") is not None:
                line += f", final accuracy {100 * (other['final_test_acc'] - seq['final_test_acc']):+.2f} points"
            lines.append(line)
        base = by.get((name, BASELINE))
        for engine in [e for e in present if e != BASELINE]:
            other = by.get((name, engine))
            if not (base and other and base["s_per_round"] and other["s_per_round"]):
                continue
            line = (f"  {name} {engine} vs PFLlib's procedure ({tag}): speed-up {base['s_per_round'] / other['s_per_round']:.2f}x "
                    f"per round, {base['train_s_per_round'] / other['train_s_per_round']:.2f}x training")
            if base["eval_s_per_round"] and other["eval_s_per_round"]:
                line += f", {base['eval_s_per_round'] / other['eval_s_per_round']:.2f}x evaluation"
            if not interleaved:
                line += f", peak RSS {other['peak_rss_mb']:.0f} vs {base['peak_rss_mb']:.0f} MB"
            if base.get("final_test_acc") is not None and other.get("final_test_acc") is not None:
                line += f", final accuracy {100 * (other['final_test_acc'] - base['final_test_acc']):+.2f} points"
            lines.append(line)
        if name == "P1" and not interleaved and not base:
            lines.append(f"  P1: add '{BASELINE}' to --engines for the speed-up over PFLlib's procedure in the same run "
                         "(figures from another day do not compare on a shared machine)")
    return lines


def print_table(results: list[dict], device: str, notes: dict[str, str]) -> None:
    print(f"\ndevice: {device_name(device)}")
    for name, note in notes.items():
        print(f"  {name}: {CONFIGS[name]['title']}  [{note}]")
    head = (f"{'cfg':4} {'engine':10} {'mode':5} {'s/round':>8} {'train s':>8} {'eval s':>7} {'CPU s':>7} "
            f"{'samples/s':>9} {'peak RSS MB':>11} {'GPU MB':>7} {'state MB':>8} {'acc':>6} {'thr':>3} {'load':>5}")
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['config']:4} {r['engine']:10} failed: {r['error']}")
            continue
        mode = "inter" if r.get("interleaved") else "sep"
        rss = "(sum)" if r.get("interleaved") else fmt(r["peak_rss_mb"], "11.0f")
        load = r.get("load_avg_before", [None])[0]
        print(f"{r['config']:4} {r['engine']:10} {mode:5} {fmt(r['s_per_round'], '8.2f')} {fmt(r['train_s_per_round'], '8.2f')} "
              f"{fmt(r['eval_s_per_round'], '7.2f')} {fmt(r['cpu_s_per_round'], '7.2f')} "
              f"{fmt(r['train_samples_per_s'], '9.0f')} {rss:>11} {fmt(r.get('peak_gpu_mb'), '7.0f')} "
              f"{fmt(r['state_mb'], '8.1f')} {fmt(r['final_test_acc'], '6.4f')} {r['threads']:3d} {fmt(load, '5.1f')}")
    lines = _ratio_lines(results, list(notes), False) + _ratio_lines(results, list(notes), True)
    if lines:
        print("ratios (batched/sequential: < 1 means the batched engine is faster; speed-ups: > 1 means ours is faster):")
        print("\n".join(lines))
    for r in results:
        if r.get("startup_s") is not None and not r.get("interleaved"):
            print(f"  {r['config']} ray: start-up {r['startup_s']:.1f} s (Ray instance and actors, in the warm-up "
                  f"round); actors' peak RSS " + ", ".join(f"{m:.0f}" for m in r["workers_peak_rss_mb"])
                  + " MB; actors' state " + ", ".join(f"{m:.1f}" for m in r["workers_state_mb"]) + " MB")
    for r in results:
        if r.get("state_trace") and r.get("clients_with_state") and not r.get("interleaved"):
            where = " on disk" if r.get("state_store") == "DiskStateStore" else ""
            print(f"  {r['config']} {r['engine']}: state {r['state_mb']:.1f} MB{where} for {r['clients_with_state']} clients "
                  f"({r['state_bytes_per_client'] / 1024**2:.2f} MB each; all {r['clients']}: "
                  f"{r.get('state_mb_if_all_clients', 0):.0f} MB); model {r['model_mb']:.2f} MB; "
                  "after each round: state " + ", ".join(f"{t['state_mb']:.0f}" for t in r["state_trace"])
                  + " MB, RSS " + ", ".join(f"{t['rss_mb']:.0f}" for t in r["state_trace"]) + " MB")
