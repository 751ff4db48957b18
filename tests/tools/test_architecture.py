"""The layout is the architecture: these hold of the source tree, without a device.

- no import cycle among torch_adreno's modules, counting imports inside functions and under
  ``TYPE_CHECKING`` (a cycle there still couples the modules);
- every folder of the package, and every module at its root, has a layer (:data:`LAYERS`, one per
  folder: no module of a folder sits elsewhere); a module imports only its own layer or lower ones;
- no file over 600 lines, no class over 250;
- no module after the code-generation stage parses or edits OpenCL text: the only regular
  expressions outside ``kernels/`` are the ones :data:`REGEX_USES` lists, with what they read.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "torch_adreno"

#: Each folder's layer (and each root module's): a module may import modules of its own layer or
#: lower ones. The compiler's stages in pipeline order (a stage reads the data types of the ones
#: before it: ir, lowering, fusion, memory, kernels); the runtime; the replayed step recorded on it;
#: the ONNX export of a recorded step; training (TrainingStep, which exports); the frontend, which
#: drives all of them for Dynamo, with the changes to PyTorch it installs on import; the public
#: surface; the tools above everything they drive.
LAYERS: dict[str, int] = {
    "errors": 0, "targets": 0, "data": 0, "models": 0, "runner": 0, "remote": 0,
    "opencl_drivers": 1, "config": 1, "dynamo_registry": 1,
    "ir": 2,
    "lowering": 3, "fusion": 3,
    "memory": 4,
    "kernels": 5,
    "runtime": 6,
    "profiler": 7, "replay": 7,
    "export": 8,
    "training": 9,
    "frontend": 10, "torch_patches": 10,
    "api": 11,
    "": 12,
    "tools": 13, "tools.testing": 13, "tools.bench": 14, "federated": 14,
    "cli": 15,
    "__main__": 16,
}

#: Regular expressions outside kernels/, each with what it reads (none reads kernel source).
REGEX_USES: dict[str, str] = {
    "runtime.tuning": "a device's name, made into a directory name",
    "targets.profiles": "an OpenCL device's name, for the Adreno model number",
    "lowering.context": "a Dynamo source path, for a parameter's name",
    "tools.testing.opinfo_errors": "eager's error messages, for the op they name",
    "training.pieces": "Dynamo's graph-break message, for its reason without its hints",
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """The package modules ``name`` imports (anywhere in it), with the line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".") if package else []
                parents = parents[:len(parents) - node.level + 1]
                base = ".".join(["torch_adreno", *parents, *([base] if base else [])])
            targets = [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            if target != "torch_adreno" and not target.startswith("torch_adreno."):
                continue
            local = target.removeprefix("torch_adreno").removeprefix(".")
            while local not in MODULES and local:
                local = local.rpartition(".")[0]
            if local != name:
                yield local, node.lineno


GRAPH = {name: sorted(set(_imports(name, path))) for name, path in MODULES.items()}


def test_no_import_cycle():
    edges = {name: {target for target, _ in imports} for name, imports in GRAPH.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c or ["torch_adreno"] for c in cycle)
                                                     for cycle in cycles)


def _layer(name: str) -> int:
    prefixes = [p for p in LAYERS if (p == name == "") or (p and (name == p or name.startswith(p + ".")))]
    if not prefixes:
        raise AssertionError(f"module torch_adreno.{name} is in no layer of test_architecture.LAYERS: add it")
    return LAYERS[max(prefixes, key=len)]


def test_the_layers_are_the_folders_and_the_root_modules_exactly():
    """One layer per folder (a module's layer is its folder's; no module has one of its own) and
    per module at the package's root."""
    folders = {".".join(init.parent.relative_to(PACKAGE).parts) for init in PACKAGE.rglob("__init__.py")}
    root_modules = {path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    assert set(LAYERS) == folders | root_modules, (
        f"not layered: {sorted(folders | root_modules - set(LAYERS))}; "
        f"neither a folder nor a root module: {sorted(set(LAYERS) - folders - root_modules)}")


#: The compiler's stages: plain data in, plain data out, no device (tests run them without one).
STAGES = ("ir", "lowering", "fusion", "memory", "kernels")


def test_no_compiler_stage_imports_the_runtime_or_pyopencl():
    wrong = []
    for name, path in MODULES.items():
        if name.split(".")[0] not in STAGES:
            continue
        wrong += [f"torch_adreno.{name} imports torch_adreno.{target} at line {line}"
                  for target, line in GRAPH[name] if target.split(".")[0] in ("runtime", "replay", "training")]
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"torch_adreno.{name} imports {n} at line {node.lineno}" for n in names
                      if n.split(".")[0] == "pyopencl"]
    assert not wrong, "\n".join(wrong)


def test_every_module_imports_only_its_layer_or_lower_ones():
    wrong = [f"torch_adreno.{name} (layer {_layer(name)}) imports torch_adreno.{target} (layer {_layer(target)}) "
             f"at line {line}"
             for name, imports in GRAPH.items() for target, line in imports if _layer(target) > _layer(name)]
    assert not wrong, "\n".join(wrong)


def test_no_file_over_600_lines_and_no_class_over_250():
    long_files = [f"{path.relative_to(PACKAGE.parent)}: {n} lines" for path in MODULES.values()
                  if (n := path.read_text().count("\n")) > 600]
    long_classes = [f"{path.relative_to(PACKAGE.parent)}: class {node.name}, {node.end_lineno - node.lineno + 1} lines"
                    for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250]
    assert not long_files and not long_classes, "\n".join(long_files + long_classes)


def _regex_calls(path: Path) -> list[int]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "re" and node.func.attr in ("sub", "subn", "search", "match", "fullmatch",
                                                                       "finditer", "findall", "compile", "split"):
            calls.append(node.lineno)
    return calls


def test_no_module_after_the_kernels_stage_reads_kernel_text_with_regular_expressions():
    found = {name: lines for name, path in MODULES.items()
             if not (name == "kernels" or name.startswith("kernels.")) and (lines := _regex_calls(path))}
    unexplained = {name: lines for name, lines in found.items() if name not in REGEX_USES}
    assert not unexplained, (f"regular expressions outside kernels/ (lines {unexplained}): kernels carry their "
                             "parameters and symbols as records (KernelSource.arguments); read those, or list "
                             "the use in REGEX_USES with what it reads")
    assert set(REGEX_USES) <= set(found), f"REGEX_USES lists modules that no longer use one: {set(REGEX_USES) - set(found)}"


@pytest.mark.parametrize("table", ["LAYERS", "REGEX_USES"])
def test_the_tables_name_modules_that_exist(table):
    names = LAYERS if table == "LAYERS" else REGEX_USES
    missing = [n for n in names if n and not any(m == n or m.startswith(n + ".") for m in MODULES)]
    assert not missing, f"{table} names modules that do not exist: {missing}"


def _module_settings(path: Path) -> list[str]:
    """What in ``path`` makes module-level state a setting: ``global`` statements (a function
    rebinding a module's name), and assignments to another module's attribute (``gemm.X = ...``)."""
    tree = ast.parse(path.read_text())
    imported = {alias.asname or alias.name.rpartition(".")[2] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch_adreno")
                for alias in node.names}
    imported |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names if alias.name.startswith("torch_adreno")}
    found = [f"line {node.lineno}: global {', '.join(node.names)}" for node in ast.walk(tree)
             if isinstance(node, ast.Global)]
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id in imported and target.attr.isupper():
                found.append(f"line {node.lineno}: {ast.unparse(target)} assigned")
    return found


def test_no_module_global_settings():
    """Kernel and code-path choices are data (options, the device profile, function parameters),
    never module globals the package rebinds: it has no ``global`` statement and assigns no other
    module's constants."""
    found = {name: hits for name, path in MODULES.items() if (hits := _module_settings(path))}
    assert not found, f"module-level settings: {found}"
