"""Imports point down the layers of docs/architecture.md: a module imports its own layer or
those below, never above; training and conversion sit beside the stack, which never
imports them."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no model on disk

ROOT = Path(__file__).parents[1]
LAYERS = [  # bottom first
    ("localspec.errors", "localspec.paths", "localspec._native", "localspec.progress",
     "localspec.datasets"),
    ("localspec.llama", "localspec.sampling", "localspec.store", "localspec.found", "localspec.hub",
     "localspec.pull"),
    ("localspec.verify",),
    ("localspec.drafters",),
    ("localspec.control",),
    ("localspec.loop",),
    ("localspec.engine", "localspec.worker"),
    ("localspec.cli", "localspec.bench", "localspec.serve", "tui"),
]
BESIDE = ("localspec.train", "localspec.convert")


def layer(module: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.split(".")[0] in ("localspec", "tui")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_imports_point_down():
    wrong = []
    for path in sorted([*ROOT.glob("localspec/**/*.py"), *ROOT.glob("tui/**/*.py")]):
        me = module_name(path)
        beside = me.startswith(BESIDE)
        for target in imports(path):
            if target == "localspec" or target.startswith("localspec.__"):
                continue
            if target.startswith(BESIDE):
                if not beside and layer(me) != len(LAYERS) - 1:
                    wrong.append(f"{me} imports {target} (beside the stack)")
                continue
            mine, theirs = layer(me), layer(target)
            if theirs is None:
                continue  # a name imported from a package, counted by its package
            if beside:
                if theirs == len(LAYERS) - 1:
                    wrong.append(f"{me} imports the surface {target}")
            elif mine is not None and theirs > mine:
                wrong.append(f"{me} imports {target}, a layer above")
    assert not wrong, "\n".join(wrong)


def test_every_module_has_a_layer():
    for path in ROOT.glob("localspec/**/*.py"):
        me = module_name(path)
        assert layer(me) is not None or me.startswith(BESIDE) or me == "localspec", me


def test_no_request_path_imports_the_download_code():
    """Surfaces pull what they run before an engine starts (localspec/pull.py): the engine, its
    worker and the server never import the download code."""
    code = ("import sys, localspec.engine, localspec.worker, localspec.serve.app; "
            "print(sorted(m for m in ('localspec.pull', 'localspec.hub', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_functions_and_classes_stay_readable():
    """docs/architecture.md's limits: no function in localspec/ or tui/ longer than 80 lines
    (the CLI's table of arguments aside), no class longer than 300."""
    long = []
    for path in sorted([*ROOT.glob("localspec/**/*.py"), *ROOT.glob("tui/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > 80 \
                    and (path.name, node.name) != ("cli.py", "parser"):
                long.append(f"{path.relative_to(ROOT)}: function {node.name}, {lines} lines")
            elif isinstance(node, ast.ClassDef) and lines > 300:
                long.append(f"{path.relative_to(ROOT)}: class {node.name}, {lines} lines")
    assert not long, "\n".join(long)


def test_the_loop_reads_at_once():
    """Issue 45: the loop itself (loop.run) is at most 60 lines."""
    tree = ast.parse((ROOT / "localspec/loop.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert run.end_lineno - run.lineno + 1 <= 60
