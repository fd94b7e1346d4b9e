"""The house keeps its shape: imports run down the data path (editor -> lsp_server -> specdec -> model), never up.

Read from the source with `ast`, so a violation inside a function (a lazy import) counts too.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("specdec", "lsp_server", "adapters", "finetune")
# what each package may import from the others
ALLOWED = {
    "specdec": set(),
    "adapters": {"specdec"},
    "finetune": {"specdec", "adapters"},
    "lsp_server": {"specdec", "adapters"},
}


def imported_packages(path: Path) -> dict[str, int]:
    """Top-level names of the project's packages a file imports, with the first line of each."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGES:
                found.setdefault(top, node.lineno)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_down_the_data_path(package):
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for other, line in imported_packages(path).items():
            if other != package and other not in ALLOWED[package]:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {other}")
    assert not violations, "\n".join(violations)


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from lsp_server.syntax import analyze\n")
    assert imported_packages(bad) == {"lsp_server": 2}


@pytest.mark.parametrize("module", ["specdec.cli", "lsp_server.settings", "lsp_server.server"])
def test_the_parser_and_the_server_start_without_torch(module):
    """`specdec --help` and the server's `initialize` stay fast: torch loads with the models, not before."""
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted({{'torch', 'transformers'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
