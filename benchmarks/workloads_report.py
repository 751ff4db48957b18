"""What ``benchmarks/workloads.py`` prints: the per-workload table of the peers (step times, compile
times, device times, energy per step), ours' per-kernel breakdown, and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def breakdown_text(row: dict[str, Any], rows: int) -> str:
    """The profiled step of ours: totals, then by kernel kind, ATen op and kernel, each row's GFLOP/s
    and GB/s also as a share of the device's measured FLOP/s and bandwidth peaks."""
    peaks = row.get("device_peaks") if isinstance(row.get("device_peaks"), dict) else None
    lines = [f"  ours, one replayed step: device {row['device_ms']:.3f} ms, {row['launches']} launches, "
             f"kernel bytes {(row['kernel_bytes_read'] + row['kernel_bytes_written']) / 1e9:.4f} GB, "
             f"{row['gflop']:.3f} GFLOP, replay host {fmt(row['replay_host_us'], '.0f')} us, "
             f"host fallback ops {len(row['host_fallback_ops'])}"
             + (f"; device peaks measured: {peaks['gflops']:.0f} GFLOP/s, {peaks['bandwidth_gbs']:.0f} GB/s"
                if peaks else ""),
             f"  {'kind / op / kernel':<52} {'calls':>5} {'ms':>9} {'share':>6} {'GFLOP':>8} {'GFLOP/s':>9} "
             f"{'MB':>9} {'GB/s':>8} {'%FLOP':>6} {'%BW':>5}"]

    def line(name: str, r: dict[str, Any]) -> str:
        flop = r["gflops"] / peaks["gflops"] if peaks and r["gflops"] is not None else None
        bandwidth = r["gbs"] / peaks["bandwidth_gbs"] if peaks and r["gbs"] is not None else None
        return (f"  {name[:52]:<52} {r['calls']:>5} {r['time_ms']:>9.3f} {r['share']:>6.1%} {r['gflop']:>8.3f} "
                f"{fmt(r['gflops'], '9.1f'):>9} {r['mb']:>9.2f} {fmt(r['gbs'], '8.1f'):>8} "
                f"{fmt(flop, '6.0%'):>6} {fmt(bandwidth, '5.0%'):>5}")

    lines += [line(f"[{kind}]", r) for kind, r in row["by_kind"].items()]
    lines += [line(r["name"].removeprefix("aten."), r) for r in row["by_op"][:rows]]
    lines += [line(r["name"], r) + f"  {','.join(r['ops'])[:60]}" for r in row["by_kernel"][:rows]]
    return "\n".join(lines)


def table(records: list[dict[str, Any]]) -> str:
    header = (f"{'workload':<13} {'peer':<53} {'median ms':>9} {'min ms':>8} {'x eager':>7} {'loss first':>10} "
              f"{'loss last':>10} {'compile s':>9} {'warm s':>6} {'device ms':>9} {'launches':>8} {'GB':>7} "
              f"{'GFLOP':>8} {'J/step':>8} replayed")
    lines = [header]
    for r in records:
        if r.get("phase") == "warm":
            continue
        if "error" in r:
            lines.append(f"{r['workload']:<13} {r.get('label', r['peer']):<53} ERROR {r['error'][:200]}")
            continue
        eager = next((e for e in records if e["workload"] == r["workload"] and e["peer"] == "eager"
                      and "median_ms" in e), None)
        ratio = r["median_ms"] / eager["median_ms"] if eager else None
        compile_s = r.get("compile_s", r["first_call_s"] if r["peer"].startswith("inductor") else None)
        kernel_gb = ((r["kernel_bytes_read"] + r["kernel_bytes_written"]) / 1e9 if "kernel_bytes_read" in r else None)
        replayed = (f"{r['replayed_steps']} ({'all timed' if r['timed_steps_replayed'] else 'NOT all timed'})"
                    if "replayed_steps" in r else "")
        lines.append(
            f"{r['workload']:<13} {r['label']:<53} {r['median_ms']:>9.2f} {r['min_ms']:>8.2f} {fmt(ratio, '7.2f'):>7} "
            f"{r['loss_first']:>10.5f} {r['loss_last']:>10.5f} {fmt(compile_s, '9.1f'):>9} "
            f"{fmt(r.get('compile_warm_s'), '6.1f'):>6} {fmt(r.get('device_ms'), '9.2f'):>9} "
            f"{fmt(r.get('launches'), '8d'):>8} {fmt(kernel_gb, '7.3f'):>7} {fmt(r.get('gflop'), '8.2f'):>8} "
            f"{fmt(r.get('energy_j_per_step'), '8.4f'):>8} {replayed}")
    lines += energy_notes(records)
    return "\n".join(lines)


def energy_notes(records: list[dict[str, Any]]) -> list[str]:
    """Under the table: where each peer's joules per step were read, or why they were not."""
    lines = []
    for r in records:
        if r.get("phase") == "warm" or ("energy_source" not in r and "energy_not_measured" not in r):
            continue
        if r.get("energy_j_per_step") is None:
            how = f"not measured: {r.get('energy_not_measured')}"
        else:
            how = (f"{r['energy_j_per_step']:.4f} J/step: {r['energy_joules']:.3f} J over {r['energy_steps']} steps in "
                   f"{r['energy_window_s']:.2f} s ({r['energy_source']})" + "".join(f"; {n}" for n in r["energy_notes"]))
        lines.append(f"  energy, {r['workload']}, {r.get('label', r['peer'])}: {how}")
    return lines


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.get("phase") != "warm" and "median_ms" in r]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    if not workloads:
        return
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        mine = [r for r in rows if r["workload"] == workload]
        bars = ax.bar(range(len(mine)), [r["median_ms"] for r in mine],
                      color=["tab:red" if r["peer"] == "ours" else "tab:blue" for r in mine])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(mine)), [r["label"].split(" (")[0] for r in mine], rotation=30, ha="right",
                      fontsize=8)
        ax.set_title(mine[0].get("title", workload), fontsize=8)
        ax.set_ylabel("step ms (median)")
    fig.suptitle(f"training step, {rows[0].get('device', '')}, torch {rows[0].get('torch', '')}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
