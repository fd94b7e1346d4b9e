"""A regular install works: the wheel holds every package and data file of the tree, and nothing else, and installed
in a fresh venv (no checkout on its path) it serves, fine-tunes and runs the CLI.

`pip install -e .` (setup.sh) maps the checkout itself, so a package or data folder the build leaves out goes
unnoticed there: this test compares the built wheel with the tree's files, so a forgotten folder fails it.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {"specdec": "specdec", "lsp_server": "lsp_server", "adapters": "specdec_adapters",
           "finetune": "specdec_finetune", "bench": "specdec_bench"}  # folder -> import name (pyproject.toml / setup.py)


def tree_files() -> list[str]:
    """The checkout's files as git sees them (tracked, and new ones not ignored), relative to ROOT."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tree's files are unknown")
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def expected_in_wheel(files: list[str]) -> set[str]:
    """Each file under a shipped folder, at its installed path (adapters/x.py -> specdec_adapters/x.py)."""
    expected = set()
    for name in files:
        folder, _, rest = name.partition("/")
        if folder in SHIPPED and rest:
            expected.add(f"{SHIPPED[folder]}/{rest}")
    return expected


def packages(expected: set[str]) -> list[str]:
    return sorted(name[: -len("/__init__.py")].replace("/", ".") for name in expected
                  if name.endswith("/__init__.py"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Builds the wheel from a copy of the tree (the build writes build/ and *.egg-info beside its sources)."""
    from importlib.metadata import version

    assert int(version("setuptools").split(".")[0]) >= 77, "the build needs setuptools>=77 (the `test` extra)"
    work = tmp_path_factory.mktemp("wheel")
    files = tree_files()
    for name in files:
        (work / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, work / "src" / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "-q", "-w", str(work / "dist"), str(work / "src")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (path,) = (work / "dist").glob("specdec-*.whl")
    return path, files


def test_the_wheel_holds_every_package_and_data_file_and_nothing_else(wheel):
    path, files = wheel
    names = {n for n in zipfile.ZipFile(path).namelist() if not n.endswith("/")}
    shipped = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    expected = expected_in_wheel(files)
    assert "specdec/repository/__init__.py" in expected  # the package a hand-kept list once missed
    assert sorted(expected - shipped) == [], "files of the tree missing from the wheel"
    assert sorted(shipped - expected) == [], "files in the wheel that the tree does not have"
    assert {n.split("/")[0] for n in names} == set(SHIPPED.values()) | {"specdec-0.1.0.dist-info"}
    data = sorted(n for n in expected if not n.endswith(".py"))
    print(f"wheel {path.name}: {len(expected)} files ({len(data)} data) in {len(packages(expected))} packages: "
          + ", ".join(packages(expected)) + (f"; data: {', '.join(data)}" if data else ""))


def test_the_installed_wheel_imports_and_runs_without_the_checkout(wheel, tmp_path):
    path, files = wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # conftest puts the checkout there
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "--disable-pip-version-check", "-q", str(path)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    # the dependencies (torch, transformers, ...) from this environment's site-packages, as plain path entries: their
    # .pth files (an editable install of this checkout among them) are not run
    site = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (site_packages,) = (venv / "lib").glob("python*/site-packages")
    (site_packages / "dependencies.pth").write_text("\n".join(site) + "\n")
    names = packages(expected_in_wheel(files))
    check = ("import importlib, sys\n"
             "for name in sys.argv[1:]:\n"
             "    module = importlib.import_module(name)\n"
             "    assert module.__file__.startswith(sys.prefix), (name, module.__file__)\n"
             "import specdec.repository, lsp_server.server, specdec_finetune.run, specdec_bench.commands\n"
             "print('imported', len(sys.argv) - 1, 'packages from', sys.prefix)\n")
    imported = subprocess.run([str(python), "-c", check, *names], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    assert f"imported {len(names)} packages" in imported.stdout
    cli = subprocess.run([str(venv / "bin" / "specdec"), "--help"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    for command in ("complete", "serve", "finetune", "adapters", "bench"):
        assert command in cli.stdout
