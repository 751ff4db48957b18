"""The fusion-gain benchmark suite behind ``python -m torch_adreno bench`` (and benchmarks/).

Reference models x configurations (:data:`benchmark.SUITE_VARIANTS`), plus PyTorch's CUDA paths
where CUDA exists, timed interleaved on one machine; JSON lines and PNG plots of the gains.
"""

from __future__ import annotations

import datetime
import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from torch_adreno.remote import RemoteDevice, device_profile, parse_remote
from torch_adreno.runtime import get_runtime
from torch_adreno.tools.bench.measure import SUITE_VARIANTS, StepStats, compare_variants, cuda_step, steps_run


def run_context(device: str | int | None) -> dict[str, Any]:
    address = parse_remote(device)
    if address is not None:
        with RemoteDevice(*address) as remote:
            profile = device_profile(remote.properties())
    else:
        profile = get_runtime(device).profile
    return {"date": datetime.date.today().isoformat(), "device": profile.name, "platform": profile.platform,
            "driver": profile.driver, "torch": torch.__version__, "host": platform.node(),
            "host_threads": torch.get_num_threads(), **({"remote": f"{address[0]}:{address[1]}"} if address else {})}


def run_suite(models: Sequence[str], steps: int, out_dir: Path, device: str | int | None = None,
              variants: Sequence[str] | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Measure every model in every configuration; write ``suite.jsonl`` (appended to) and
    ``suite.png`` to ``out_dir``. ``progress``: a bar of the steps run (stderr), what runs now
    beside it (compiling is most of a short run)."""
    from tqdm import tqdm

    chosen = {k: v for k, v in SUITE_VARIANTS.items() if variants is None or k in variants}
    base: dict[str, Any] = {"device": device} if device is not None else {}
    remote = parse_remote(device) is not None
    if remote:
        # On a remote device only a TrainingStep runs (its captured steps, shipped there), and eager
        # would measure this machine, not the device.
        chosen = {k: v for k, v in chosen.items() if v != "eager"}
        base["training_step"] = True
    configs = {k: (v if v == "eager" else {**base, **v}) for k, v in chosen.items()}  # type: ignore[dict-item]
    context = run_context(device)
    records: list[dict[str, Any]] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    total = len(models) * sum(steps_run(v, steps, remote=remote) for v in configs.values())
    with tqdm(total=total, desc="benchmark suite", unit="step", disable=not progress) as bar:
        def advance(what: str, done: int) -> None:
            bar.set_postfix_str(what, refresh=done == 0)  # (compiling: seconds before the next step)
            bar.update(done)

        for model in models:
            stats: list[StepStats] = compare_variants(model, configs, steps=steps, interleaved=not remote,
                                                      progress=advance)
            for compiled in (False, True) if not remote else ():
                peer = cuda_step(model, steps, compiled)
                if peer is not None:
                    stats.append(peer)
            records.extend({**s.as_json(), **context, "benchmark": "suite"} for s in stats)
    with (out_dir / "suite.jsonl").open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    plot_suite(records, out_dir)
    return records


def summary_table(records: Sequence[dict[str, Any]]) -> str:
    def cell(value: Any, scale: float = 1.0, fmt: str = ".2f") -> str:
        return "" if value is None else f"{value / scale:{fmt}}"

    lines = [f"{'model':<12} {'variant':<24} {'step ms':>9} {'launches':>9} {'kernel MB':>10} {'h2d KB':>9} "
             f"{'peak MB':>8} {'compile s':>9}"]
    for r in records:
        launches = r.get("kernel_launches")
        kernel = (r.get("bytes_kernel_read") or 0) + (r.get("bytes_kernel_written") or 0) if launches else None
        lines.append(
            f"{r['model']:<12} {r['variant']:<24} {r['median_ms']:>9.2f} {cell(launches, 1, '.0f'):>9} "
            f"{cell(kernel, 1e6, '.1f'):>10} {cell(r.get('bytes_host_to_device'), 1e3, '.1f'):>9} "
            f"{cell(r.get('peak_device_bytes'), 1e6, '.1f'):>8} {cell(r.get('compile_s'), 1, '.1f'):>9}")
    return "\n".join(lines)


def plot_suite(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Bar charts of step time, launches and kernel bytes per model and configuration (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install torch-adreno[bench])")
        return []
    models = list(dict.fromkeys(r["model"] for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    panels = [("median_ms", "step time (ms)"), ("kernel_launches", "kernel launches per step"),
              ("kernel_bytes", "kernel DRAM bytes per step (MB)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    width = 0.8 / max(len(variants), 1)
    for ax, (key, title) in zip(axes, panels, strict=True):
        for i, variant in enumerate(variants):
            values = []
            for model in models:
                r = next((r for r in records if r["model"] == model and r["variant"] == variant), None)
                if r is None:
                    values.append(0.0)
                elif key == "kernel_bytes":
                    values.append(((r.get("bytes_kernel_read") or 0) + (r.get("bytes_kernel_written") or 0)) / 1e6)
                else:
                    values.append(float(r.get(key) or 0.0))
            ax.bar([m + i * width for m in range(len(models))], values, width, label=variant)
        ax.set_xticks([m + width * (len(variants) - 1) / 2 for m in range(len(models))], models)
        ax.set_title(title)
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"torch_adreno fusion gains on {records[0]['device']} ({records[0]['date']})")
    fig.tight_layout()
    path = out_dir / "suite.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
