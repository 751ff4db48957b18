"""The native runtime's C unit tests (native/tests/, registered with CMake's ``add_test``), run by
``ctest`` in the release build and in the AddressSanitizer + UBSan build (leaks included): SHA-256
and the integrity check, the ONNX reader and the plan's checks, the safetensors and .npz readers,
the command's batches. They need a C compiler and CMake, no OpenCL device: the builds are the
session's own (native_fixtures), so the suite compiles nothing more for them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torch_adreno.cli.native import NativeBuild

#: native/CMakeLists.txt's UNIT_TESTS: each must run (a test dropped from the list fails here).
UNIT_TESTS = ("test_integrity", "test_onnx_plan", "test_safetensors", "test_npz", "test_batches")
#: ctest's summary: "100% tests passed out of 5", "80% tests passed, 1 tests failed out of 5"
SUMMARY = re.compile(r"(\d+)% tests passed(?:, (\d+) tests? failed)? out of (\d+)")
#: each unit test's last line (native/tests/check.c, check_finish)
CHECKS = re.compile(r"(test_\w+): (\d+) checks, (\d+) failed")


def ctest_program() -> str:
    """ctest, on PATH or beside cmake (pip's cmake installs both)."""
    found = shutil.which("ctest")
    cmake = shutil.which("cmake")
    if found is None and cmake is not None and (Path(cmake).parent / "ctest").is_file():
        found = str(Path(cmake).parent / "ctest")
    if found is None:
        pytest.fail("ctest is not installed beside cmake (pip install cmake brings both)")
    return found


def run_ctest(build: NativeBuild) -> tuple[int, dict[str, int]]:
    """Runs ctest in ``build``; returns how many tests ran and each unit test's count of checks.
    Asserts that every test passed."""
    done = subprocess.run([ctest_program(), "--output-on-failure", "--verbose", "--timeout", "60"],
                          cwd=build.build_dir, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    summary = SUMMARY.search(output)
    assert summary is not None, f"no ctest summary in:\n{output[-4000:]}"
    percent, failed, total = int(summary[1]), int(summary[2] or 0), int(summary[3])
    assert done.returncode == 0 and percent == 100 and failed == 0, output[-8000:]
    checks = {name: int(count) for name, count, failures in CHECKS.findall(output) if int(failures) == 0}
    return total, checks


@pytest.mark.parametrize("variant", ["native", "sanitized"])
def test_the_c_unit_tests_pass_under_ctest(request, variant) -> None:
    build: NativeBuild = request.getfixturevalue(variant)
    total, checks = run_ctest(build)
    assert total >= len(UNIT_TESTS) > 0
    for name in UNIT_TESTS:
        # each ran and asserted something (the SHA-256 vectors, every cut of the files, ...)
        assert checks.get(name, 0) >= 10, f"{name} ran no checks: {checks}"
