"""Regenerate the projection's calibration (torch_adreno/tools/bench/calibration_reference_gpu.json) from H200 results.

Reads ``benchmarks/workloads.py`` records of our replayed step profiled on the H200 (``peer`` "ours",
``by_kind`` present, the profiled step replayed, full sizes), and for each workload and kernel kind
computes the achieved fraction of the H200's roofline (:mod:`torch_adreno.tools.bench.calibration`).

The H200's peaks:

- fp32: 67 TFLOP/s, NVIDIA's H200 SXM datasheet (FP32 67 TFLOPS); this project's own FMA-chain
  micro-benchmark (``device_peaks`` in the records) reached 56.5-59.8 TFLOP/s;
- bandwidth: the best copy bandwidth this project measured on it (``device_peaks.bandwidth_gbs`` of
  the records read: a float4 stream kernel, read + write), against HBM3e's 4.8 TB/s nominal.

    python benchmarks/calibrate_projection.py                         # the H200 records of 2026-12-02
    python benchmarks/calibrate_projection.py benchmarks/results/h200/workloads.jsonl ...  # others
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RESULTS

from torch_adreno.tools.bench.calibration import CALIBRATION_FILE, calibration_data, load_calibration

REPOSITORY = RESULTS.parent.parent
#: The records the stored calibration was made from (profiled steps of the three workloads; also the
#: projection tests' input, hence kept with the tests).
DEFAULT_RESULTS = (REPOSITORY / "tests" / "data" / "workloads_reference_gpu.jsonl",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path, default=list(DEFAULT_RESULTS),
                        help="benchmarks/workloads.py JSON-lines files measured on the H200")
    parser.add_argument("--out", type=Path, default=CALIBRATION_FILE)
    args = parser.parse_args()
    paths = [p.resolve() for p in args.results]
    records = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    files = ", ".join(str(p.relative_to(REPOSITORY)) if REPOSITORY in p.parents else str(p) for p in paths)
    args.out.write_text(json.dumps(calibration_data(records, files), indent=1) + "\n")
    calibration = load_calibration(args.out)  # the checks a projection makes
    print(f"{args.out}: {calibration.device}, {calibration.peak_gflops / 1e3:.0f} TFLOP/s, "
          f"{calibration.bandwidth_gbs:.0f} GB/s")
    for workload, kinds in calibration.fractions.items():
        print(f"  {workload:<14} " + "  ".join(
            f"{kind} {entry.fraction:.3f}" + (f" (= {entry.stand_in})" if entry.stand_in else "")
            for kind, entry in kinds.items()))


if __name__ == "__main__":
    main()
