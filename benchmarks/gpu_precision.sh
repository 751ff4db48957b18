#!/usr/bin/env bash
# Issue 15 on the lent NVIDIA GPU, in one device command (about 8 minutes):
#
#   source .gpu/env.sh && bash benchmarks/gpu_precision.sh "$OUT"
#
# 1. the half-precision tests on the GPU (float16 through vload_half/vstore_half_rte, which are
#    core OpenCL: NVIDIA's driver has no cl_khr_fp16, so native_half must be refused there);
# 2. kernel bytes and step time per precision (float32, float16 autocast + GradScaler, bfloat16
#    autocast) for the four reference models, in the same run (benchmarks/precision.py);
# 3. the float16 and bfloat16 OpInfo sweeps, sharded over the host's cores.
set -uo pipefail
out=${1:?usage: gpu_precision.sh OUT_DIR}
mkdir -p "$out"
export TORCH_ADRENO_DEVICE=${TORCH_ADRENO_DEVICE:-NVIDIA}
timeout 150 python -m pytest -q -p no:cacheprovider -rfE tests/test_half.py 2>&1 | tail -n 30 > "$out/test_half.txt"
timeout 150 python benchmarks/precision.py --device "$TORCH_ADRENO_DEVICE" --steps 30 \
  --out "$out/precision.jsonl" > "$out/precision.txt" 2>&1
cores=$(nproc)
shards=$(( cores > 4 ? (cores - 2) / 2 : 1 ))
for dtype in float16 bfloat16; do
  for i in $(seq 0 $((shards - 1))); do
    OMP_NUM_THREADS=1 timeout 200 python -m torch_adreno opinfo --dtype "$dtype" --shard "$i/$shards" \
      --jsonl "$out/opinfo_$dtype.jsonl" > "/tmp/opinfo_${dtype}_$i.txt" 2>&1 &
  done
done
wait
tail -n 3 /tmp/opinfo_*_*.txt > "$out/opinfo.txt"
