"""The layout is the architecture: no stage imports a later one."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "torch_adreno"

#: Pipeline order. Modules not listed (config, errors, target, models, data) are inputs every
#: stage may use; backend and cli drive the whole pipeline and may import any stage.
STAGES = ["ir", "lowering", "fusion", "memory", "kernels", "runtime", "profiler"]
DRIVERS = {"backend", "cli", "__init__", "__main__"}


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "torch_adreno" or len(parts) < 2:
        return None
    return parts[1]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_stage_imports_a_later_stage():
    violations = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        own = rel.parts[0]
        if own in DRIVERS or own not in STAGES:
            continue
        for imported in imports_of(path):
            other = stage_of(imported)
            if other in STAGES and STAGES.index(other) > STAGES.index(own):
                violations.append(f"{rel} imports {imported}")
    assert not violations, violations


def test_files_stay_small():
    long = [f"{p.relative_to(PACKAGE)}: {n}" for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, f"files past 600 lines hold two ideas: {long}"
