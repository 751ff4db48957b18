#!/usr/bin/env bash
# Everything issue 8 asks of the lent NVIDIA GPU, batched into one device command so that a
# session's limited device time goes to measuring, not to starting machines. Run from the
# project's root on the GPU machine, after `../shared/gpu/prepare.sh tqdm expecttest matplotlib
# contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six packaging`
# (and benchmarks/fetch_clblast.sh for the CLBlast peer) here, with .gpu carried:
#
#   source .gpu/env.sh && bash benchmarks/gpu_session.sh "$OUT" [phase ...]
#
# Phases (default: all, in this order): tests opinfo peers gemm memory suite kernels host compile. Each
# writes under the output folder given first (logs, JSON lines, plots); a phase that fails does not
# stop the others, and each is bounded by a timeout so that the results of the others come back.
# One device command may run 10 minutes: give a few phases per command, e.g. "tests opinfo", then
# "peers gemm", then "memory suite kernels host". The device tool brings back only a few files per
# command: the OpInfo shards append to one JSON-lines file and their logs to one text file.
set -uo pipefail
out=${1:?usage: gpu_session.sh OUT_DIR [phase ...]}
shift
phases=${*:-tests opinfo peers gemm memory suite kernels host compile}
mkdir -p "$out"
export TORCH_ADRENO_DEVICE=${TORCH_ADRENO_DEVICE:-NVIDIA}
cores=$(nproc)

for phase in $phases; do
  start=$(date +%s)
  case $phase in
    tests)
      # `installed` tests need the package installed (the GPU machine runs from PYTHONPATH).
      # No -x: every failure is listed; only the summary's tail comes back.
      timeout 420 python -m pytest -q -m "not installed" -p no:cacheprovider -rfE 2>&1 | tail -n 80 > "$out/tests.txt" ;;
    opinfo)
      shards=$(( cores > 2 ? cores - 2 : 1 ))
      for i in $(seq 0 $((shards - 1))); do
        OMP_NUM_THREADS=1 timeout 500 python -m torch_adreno opinfo --shard "$i/$shards" \
          --jsonl "$out/opinfo.jsonl" > "/tmp/opinfo_$i.txt" 2>&1 &
      done
      wait
      tail -n 3 /tmp/opinfo_*.txt > "$out/opinfo.txt" ;;
    peers)
      timeout 400 python benchmarks/peers.py --steps 30 --device "$TORCH_ADRENO_DEVICE" --out "$out/peers.jsonl" > "$out/peers.txt" 2>&1 ;;
    gemm)
      timeout 300 python benchmarks/gemm.py --tune --device "$TORCH_ADRENO_DEVICE" --out "$out/gemm.jsonl" > "$out/gemm.txt" 2>&1 ;;
    memory)
      timeout 300 python benchmarks/memory.py --device "$TORCH_ADRENO_DEVICE" --out "$out/memory.jsonl" > "$out/memory.txt" 2>&1 ;;
    suite)
      timeout 500 python -m torch_adreno bench --steps 30 --device "$TORCH_ADRENO_DEVICE" --out "$out" > "$out/suite.txt" 2>&1 ;;
    kernels)
      timeout 200 python benchmarks/kernels.py --device "$TORCH_ADRENO_DEVICE" --out "$out/kernels.jsonl" > "$out/kernels.txt" 2>&1 ;;
    host)
      timeout 120 python benchmarks/host_profile.py --model resnet_mini --device "$TORCH_ADRENO_DEVICE" > "$out/host_profile.txt" 2>&1 ;;
    compile)
      timeout 400 python benchmarks/compile_time.py --device "$TORCH_ADRENO_DEVICE" --out "$out/compile_time.jsonl" > "$out/compile_time.txt" 2>&1 ;;
    *)
      echo "unknown phase $phase (tests opinfo peers gemm memory suite kernels host compile)" >&2 ;;
  esac
  echo "$phase: exit $? after $(( $(date +%s) - start )) s" | tee -a "$out/phases.txt"
done
