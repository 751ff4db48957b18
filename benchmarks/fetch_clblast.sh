#!/usr/bin/env bash
# Puts libclblast.so.1 and an OpenCL ICD loader (libOpenCL.so.1) from Debian's packages into
# .gpu/lib, where benchmarks/gemm.py looks for CLBlast (the optional GEMM peer). Run on the
# development machine, in the project's root, after ../shared/gpu/prepare.sh; carry ".gpu".
set -euo pipefail
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download libclblast1 ocl-icd-libopencl1 >/dev/null)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/x"; done
mkdir -p "$root/.gpu/lib"
cp -L "$work"/x/usr/lib/x86_64-linux-gnu/libclblast.so.1 "$work"/x/usr/lib/x86_64-linux-gnu/libOpenCL.so.1 "$root/.gpu/lib/"
ls -la "$root/.gpu/lib"
