"""Regenerate native/generated/onnx.pb.{c,h}, the nanopb decoder of ONNX's ModelProto.

    python native/tools/generate_onnx_pb.py        # needs the pip packages onnx and nanopb

The schema is the one the installed ``onnx`` package was built from (its compiled descriptor of
onnx-ml.proto, so no protoc is needed), renamed ``onnx.proto``; ``onnx.options`` beside the output
says how nanopb lays out each field. The output is deterministic (no timestamps), and the build
uses the committed files as they are, so a cross build needs neither Python nor nanopb; run this
after upgrading onnx or nanopb and commit the result. The header names the versions used.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
from google.protobuf import descriptor_pb2
from onnx import onnx_ml_pb2

OUTPUT = Path(__file__).resolve().parents[1] / "generated"


def main() -> int:
    schema = descriptor_pb2.FileDescriptorProto.FromString(onnx_ml_pb2.DESCRIPTOR.serialized_pb)
    schema.name = "onnx.proto"
    files = descriptor_pb2.FileDescriptorSet(file=[schema])
    with tempfile.TemporaryDirectory() as work:
        descriptor = Path(work) / "onnx.pb"
        descriptor.write_bytes(files.SerializeToString(deterministic=True))
        done = subprocess.run([sys.executable, "-m", "nanopb.generator.nanopb_generator", "-q", "-T",
                               "-f", str(OUTPUT / "onnx.options"), "-D", str(OUTPUT), str(descriptor)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr, file=sys.stderr)
        return done.returncode
    header = OUTPUT / "onnx.pb.h"
    note = f"/* Schema: onnx {onnx.__version__} (onnx-ml.proto), by native/tools/generate_onnx_pb.py. */\n"
    header.write_text(note + header.read_text())
    print(f"wrote {OUTPUT / 'onnx.pb.c'} and {header}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
