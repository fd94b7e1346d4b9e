"""The house keeps its shape: imports run down the data path (editor -> lsp_server -> specdec -> model), never up.

Read from the source with `ast`, so a violation inside a function (a lazy import) counts too.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"specdec": "specdec", "lsp_server": "lsp_server", "specdec_adapters": "adapters",
           "specdec_finetune": "finetune", "specdec_bench": "bench"}  # import name -> folder (setup.py's package_dir)
ALLOWED = {  # what each package may import from the others
    "specdec": set(),
    "specdec_adapters": {"specdec"},
    "specdec_finetune": {"specdec", "specdec_adapters"},
    "lsp_server": {"specdec", "specdec_adapters"},
    "specdec_bench": {"specdec", "specdec_adapters", "specdec_finetune", "lsp_server"},  # on top: nothing imports it
}
# inside specdec: the engine runs whatever model it is handed and knows nothing of loading, the forwards (a native
# model is a CachedLM it is handed), prompts, benchmarks or how a repository's files are chosen; the model wing knows
# the engine only through its bounds; the repository wing reads files for whoever hands it a tokenizer and an index,
# and loads no model; the backends put the wings together for whoever completes (the server, `specdec complete`, the
# benchmarks), so none of the wings they use imports them; the native wing (kernels, the forward of our own) knows no
# prompt or backend; the prompts turn a cursor's text into token ids and know no kernel or backend; the completion
# policy (syntax rules, the cursor's window) reads the text around a cursor and nothing below the prompts' languages:
# no engine, model, kernel, index or backend, so the server, `specdec bench` and anyone completing at a cursor share
# it without loading a model; the console script and its own commands (`specdec complete`, `specdec next-edit`: a
# cursor through a backend and the completion policy) are on top of every wing, which is why each wing's rule
# forbids specdec.cli
WING_RULES = {
    "specdec/engine": ("specdec.models", "specdec.native", "specdec.prompts", "specdec.cli", "specdec.repository",
                       "specdec.backends", "specdec.completion"),
    "specdec/models": ("specdec.prompts", "specdec.cli", "specdec.engine.", "specdec.backends", "specdec.completion"),
    "specdec/repository": ("specdec.models", "specdec.prompts", "specdec.cli", "specdec.backends",
                           "specdec.completion"),
    "specdec/native": ("specdec.prompts", "specdec.cli", "specdec.repository", "specdec.backends",
                       "specdec.completion"),
    "specdec/backends": ("specdec.cli",),
    "specdec/prompts": ("specdec.cli", "specdec.native", "specdec.completion", "specdec.backends"),
    "specdec/completion": ("specdec.cli", "specdec.engine", "specdec.models", "specdec.native", "specdec.repository",
                           "specdec.backends"),
    "specdec/cli": (),  # may import every wing
}
WING_EXCEPTIONS = {"specdec.engine.limits"}


def imports(path: Path) -> dict[str, int]:
    """Every module a file imports (absolute imports), with the first line of each."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.setdefault(node.module, node.lineno)
            for alias in node.names:  # `from specdec.models import store` imports specdec.models.store
                found.setdefault(f"{node.module}.{alias.name}", node.lineno)
    return found


@pytest.mark.parametrize("package", FOLDERS)
def test_imports_run_down_the_data_path(package):
    violations = []
    for path in sorted((ROOT / FOLDERS[package]).rglob("*.py")):
        for module, line in imports(path).items():
            top = module.split(".")[0]
            if top in FOLDERS and top != package and top not in ALLOWED[package]:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("wing", WING_RULES)
def test_wings_of_specdec_keep_their_side(wing):
    violations = []
    for path in sorted((ROOT / wing).rglob("*.py")):
        for module, line in imports(path).items():
            excepted = any(module == e or module.startswith(e + ".") for e in WING_EXCEPTIONS)
            if module.startswith(WING_RULES[wing]) and not excepted:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not violations, "\n".join(violations)


WINGS = tuple(folder.replace("/", ".") for folder in WING_RULES)


def test_every_wing_of_specdec_has_its_rules():
    """A new wing (a package folder under specdec/) comes with its rule above, or nothing checks its side."""
    folders = {f"specdec/{p.parent.name}" for p in (ROOT / "specdec").glob("*/__init__.py")}
    assert folders == set(WING_RULES)


# Pairs of packages or wings that import each other (lazy imports included): a two-way pair is one layer, or an
# inversion waiting to bite. Today's pairs, each to be undone, never added to: the test fails on a pair not listed
# and on a listed pair that is gone (remove it here then, so the list stays true).
KNOWN_TWO_WAY = {
    ("specdec.models", "specdec.native"),  # the native/models split is to come
}


def layer_of(module: str) -> str | None:
    """The package, or wing of specdec, a module belongs to; None for specdec's base modules and outside modules."""
    parts = module.split(".")
    if parts[0] not in FOLDERS:
        return None
    if parts[0] != "specdec":
        return parts[0]
    wing = ".".join(parts[:2])
    return wing if wing in WINGS else None


def two_way_pairs() -> dict[tuple[str, str], list[str]]:
    """{(a, b): where a imports b and where b imports a} for every pair of layers importing each other."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            source = layer_of(".".join((name, *rel.relative_to(folder).with_suffix("").parts)))
            for module, line in imports(path).items():
                target = layer_of(module)
                if source and target and target != source:
                    edges.setdefault((source, target), []).append(f"{rel}:{line} imports {module}")
    return {(a, b): edges[a, b][:2] + edges[b, a][:2] for a, b in edges if a < b and (b, a) in edges}


def test_no_two_way_pair_beyond_the_known_ones():
    pairs = two_way_pairs()
    new = {pair: where for pair, where in pairs.items() if pair not in KNOWN_TWO_WAY}
    assert not new, "layers importing each other:\n" + "\n".join(f"{a} <-> {b}: {'; '.join(where)}"
                                                              for (a, b), where in new.items())
    gone = KNOWN_TWO_WAY - set(pairs)
    assert not gone, f"no longer two-way, remove from KNOWN_TWO_WAY: {sorted(gone)}"


def test_the_two_way_check_sees_a_pair(tmp_path, monkeypatch):
    (tmp_path / "specdec" / "completion").mkdir(parents=True)
    (tmp_path / "specdec" / "prompts").mkdir(parents=True)
    (tmp_path / "specdec" / "completion" / "a.py").write_text("from specdec.prompts import languages\n")
    (tmp_path / "specdec" / "prompts" / "b.py").write_text("def f():\n    from specdec.completion import syntax\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    for folder in FOLDERS.values():
        (tmp_path / folder).mkdir(exist_ok=True)
    assert set(two_way_pairs()) == {("specdec.completion", "specdec.prompts")}


def test_the_base_of_specdec_imports_no_wing():
    """errors, paths, hardware, file_languages: what every wing may import, so they import none (the CLI, which
    registers the wings' subcommands, is a wing of its own on top: specdec/cli/)."""
    violations = []
    for path in sorted((ROOT / "specdec").glob("*.py")):
        for module, line in imports(path).items():
            if module.startswith(WINGS):
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not violations, "\n".join(violations)


def test_nothing_imports_the_benchmarks_and_specdec_bench_finds_them():
    """The benchmarks are on top: no package imports specdec_bench (ALLOWED above), none keeps a benchmark of its own
    (lsp_server/ and finetune/ hold none: their modules import no benchmark and no `*bench*` module is left), and
    `specdec bench` is registered through the `specdec.commands` entry point with every mode's flags."""
    import tomllib

    from specdec.cli import build_parser

    assert not [p for p in ("lsp_server", "finetune", "specdec") for p in (ROOT / p).rglob("*bench*.py")
                if p.parent.name != "native"]  # python -m specdec.native.bench stays with the native forward
    commands = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["specdec.commands"]
    assert commands["bench"] == "specdec_bench.commands:register"
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    flags = {flag for action in bench._actions for flag in action.option_strings}
    assert {"--kernels", "--editor", "--humaneval", "--finetune", "--repo", "--strategies", "--cold"} <= flags


def test_the_checks_see_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from lsp_server.cursor import uri_path\n    from specdec.models import loading\n")
    found = imports(bad)
    assert found["lsp_server.cursor"] == 2 and found["specdec.models.loading"] == 3


@pytest.mark.parametrize("module", ["specdec.cli", "lsp_server.settings", "lsp_server.server", "specdec.backends",
                                    "specdec.backends.llama_server", "specdec.completion.syntax",
                                    "specdec.completion.window"])
def test_the_parser_and_the_server_start_without_torch(module):
    """`specdec --help` and the server's `initialize` stay fast: torch loads with the models, not before."""
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted({{'torch', 'transformers'}} & set(sys.modules)))"
    if module == "specdec.cli":  # `specdec serve` builds every subcommand's parser, plugins' too, before it serves
        code = code.replace("; print", "; specdec.cli.build_parser(); print")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def snake(method: str) -> str:
    """The module a method's handler lives in: its last part, camelCase to snake_case (textDocument/inlineCompletion
    -> inline_completion, specdec.accept -> accept)."""
    last = method.replace(".", "/").rsplit("/", 1)[-1]
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in last)


def test_the_server_is_routed_by_method():
    """lsp_server/api/: one module per LSP method, each registering exactly the method it is named for; the router
    registers every one, and nothing else registers a handler (server.py holds none)."""
    import importlib

    from lsp_server.api import router
    from lsp_server.server import create_server

    modules = sorted(p.stem for p in (ROOT / "lsp_server" / "api").glob("*.py") if p.stem not in ("__init__", "router"))
    handlers = {name: importlib.import_module(f"lsp_server.api.{name}") for name in modules}
    assert {h.__name__ for h in router.HANDLERS} == {h.__name__ for h in handlers.values()}
    for name, module in handlers.items():
        methods = [getattr(module, attr) for attr in ("METHOD", "COMMAND") if hasattr(module, attr)]
        assert len(methods) == 1 and snake(methods[0]) == name, (name, methods)
        assert callable(module.handle)
    features = create_server().protocol.fm
    assert set(features.features) == {h.METHOD for h in handlers.values() if hasattr(h, "METHOD")}
    assert set(features.commands) == {h.COMMAND for h in handlers.values() if hasattr(h, "COMMAND")}
    registering = []
    for path in sorted((ROOT / "lsp_server").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("feature", "command") and path != ROOT / "lsp_server" / "api" / "router.py":
                registering.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not registering, registering
    server = ast.parse((ROOT / "lsp_server" / "server.py").read_text())
    assert not [n.name for n in ast.walk(server) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.args.args and n.args.args[0].arg == "ls"]


def test_the_handlers_are_on_top_of_the_servers_state():
    """The server's state and scheduling (documents, settings, hosts, index, scheduler, ...) know no handler:
    lsp_server.api is imported by server.py alone, lsp_server.server by the `specdec serve` command alone."""
    violations = []
    for path in sorted((ROOT / "lsp_server").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for module, line in imports(path).items():
            if module.startswith("lsp_server.api") and not rel.startswith(("lsp_server/api/", "lsp_server/server.py")):
                violations.append(f"{rel}:{line} imports {module}")
            if module.startswith("lsp_server.server") and rel != "lsp_server/commands.py":
                violations.append(f"{rel}:{line} imports {module}")
    assert not violations, "\n".join(violations)


def test_the_route_check_sees_a_misnamed_handler():
    assert snake("textDocument/inlineCompletion") == "inline_completion" and snake("specdec.accept") == "accept"
    assert snake("workspace/didChangeWorkspaceFolders") == "did_change_workspace_folders"
    assert snake("specdec/stats") != "trace"
