"""A/B of the staged batch copied while the guard runs (``training/replay/batch.py`` PRESTAGE_BYTES)
against copied inline, alternated in one process on ResNet-18's full-size step.

    python benchmarks/prestage_ab.py [DEVICE]      (default: NVIDIA)
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from workloads import LR, MOMENTUM, get_workload

import torch_adreno
from torch_adreno.training.replay import batch as B

work = get_workload("resnet18", False)
model = work.make()
x, y = work.batch()
opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
train = torch_adreno.TrainingStep(model, work.loss, opt, options={"device": sys.argv[1] if len(sys.argv) > 1 else "NVIDIA"})
for _ in range(5):
    float(train(x, y))
res = {"prestaged": [], "inline": []}
ph = {"prestaged": [], "inline": []}
for rnd in range(6):
    for label in (("prestaged", "inline") if rnd % 2 == 0 else ("inline", "prestaged")):
        B.PRESTAGE_BYTES = (1 << 20) if label == "prestaged" else (1 << 62)
        for _ in range(10):
            t = time.perf_counter()
            float(train(x, y))
            res[label].append(time.perf_counter() - t)
            ph[label].append(dict(train.replay.last_phases))
for label in res:
    print(label, "median ms", round(statistics.median(res[label]) * 1e3, 3),
          {p: round(statistics.median(d[p] for d in ph[label]) * 1e3, 3) for p in ("guard", "batch", "enqueue", "after")})
print("replayed", train.replayed_steps, "mode", train.replay.batch_mode)
