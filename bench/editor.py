"""`specdec bench --editor`: replay typing sessions against `specdec serve` over stdio.

Each session opens a real source file (the engine benchmark's registry-pinned files)
with a few lines cut out, then re-types them keystroke by keystroke with seeded,
human-like pauses. Like VS Code, the client asks for an inline completion after every
keystroke and sends `$/cancelRequest` for the previous one if it is still pending.
The server runs with a private metrics file, read afterwards for per-request detail.

Then the same keystrokes are replayed against llama.cpp's `llama-server /infill` on the target's
GGUF (specdec_bench.editor_llama: llama.vim's requests, cancelled on each keystroke, the same text
window and token budget), and one table sets the two side by side. Skipped, with the install
command, when llama.cpp is missing; `--editor-servers specdec` runs ours alone.

`--repo DIR` (or a pinned package) types into the repository's held-out files instead (the fine-tune's
split), in a workspace holding its other files, against `specdec serve` twice: without its repository
index, then with it built over the workspace, so the two model-request p50s come from one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lsprotocol import types

from specdec_bench import editor_llama
from specdec_bench.llama_anchor import InfillRules, infill_files, infill_server
from lsp_server.metrics import load_records, percentile
from lsp_server.settings import Settings, SettingsError
from specdec_bench.workload import SOURCES, fetch
from specdec.errors import SpecdecError

SERVERS = ("specdec", "llama")


@dataclass
class TypingSession:
    language: str
    path: str
    before: str  # text before the cursor when typing starts
    typed: str  # what the user types
    after: str  # text after the cursor

    @classmethod
    def from_source(cls, source, text: str, lines: int = 4, seed: int = 0) -> "TypingSession":
        rows = text.split("\n")
        rng = random.Random(f"editor:{source.package}:{seed}")
        candidates = [i for i in range(len(rows) // 3, len(rows) - lines - 1)
                      if rows[i].strip() and not rows[i].strip().startswith(("#", "//", "/*", "*"))]
        start = rng.choice(candidates)
        indent = len(rows[start]) - len(rows[start].lstrip())
        head = "\n".join(rows[:start]) + "\n" + rows[start][:indent]
        typed = "\n".join([rows[start][indent:]] + rows[start + 1 : start + lines])
        tail = "\n" + "\n".join(rows[start + lines :])
        return cls(source.language, Path(source.member).name, head, typed, tail)


def keystroke_delays(text: str, seed: int) -> list[float]:
    """Seconds before each keystroke: ~8 chars/s bursts; pauses to read at line ends and to think mid-line."""
    rng = random.Random(seed)
    delays = []
    for i, ch in enumerate(text):
        delay = min(0.4, max(0.04, rng.lognormvariate(-2.1, 0.35)))  # median ~120 ms
        previous = text[i - 1] if i else ""
        if previous == "\n":
            delay += rng.uniform(2.5, 6.0)  # reading the suggestion / the next line
        elif previous in " .(,=" and rng.random() < 0.25:
            delay += rng.uniform(1.0, 3.0)  # thinking
        delays.append(delay)
    return delays


@dataclass
class ClientRecord:
    language: str
    sent: float
    done: float = 0.0
    status: str = "pending"  # served | empty | cancelled | error
    items: int = 0


@dataclass
class Replay:
    client: object
    language: str
    records: list[ClientRecord] = field(default_factory=list)

    async def run(self, session: TypingSession, uri: str, seed: int) -> None:
        text = session.before + session.after
        line = session.before.count("\n")
        character = len(session.before.split("\n")[-1].encode("utf-16-le")) // 2
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=session.language, version=1, text=text)))
        pending: tuple[str, asyncio.Task] | None = None
        version = 1
        for ch, delay in zip(session.typed, keystroke_delays(session.typed, seed)):
            await asyncio.sleep(delay)
            if pending and not pending[1].done():
                self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending[0]))
            version += 1
            here = types.Position(line, character)
            self.client.text_document_did_change(types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                [types.TextDocumentContentChangePartial(range=types.Range(here, here), text=ch)]))
            if ch == "\n":
                line, character = line + 1, 0
            else:
                character += len(ch.encode("utf-16-le")) // 2
            pending = self.request(uri, line, character)
        if pending:
            await asyncio.wait([pending[1]])
        self.client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))

    def request(self, uri: str, line: int, character: int) -> tuple[str, asyncio.Task]:
        msg_id = str(uuid.uuid4())
        record = ClientRecord(self.language, time.perf_counter())
        self.records.append(record)
        params = types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, character))

        async def send():
            try:
                result = await self.client.protocol.send_request_async(
                    types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)
                record.items = len(result.items) if result else 0
                record.status = "served" if record.items else "empty"
            except Exception as exc:  # noqa: BLE001 - a cancelled request answers with an error
                record.status = "cancelled" if "cancel" in str(exc).lower() else "error"
            record.done = time.perf_counter()

        return msg_id, asyncio.ensure_future(send())


async def replay_all(args, sessions: list[TypingSession], workdir: Path, workspace: Path | None = None,
                     uris: list[str] | None = None, options: dict | None = None) -> tuple[list[ClientRecord], dict]:
    """Type the sessions into one `specdec serve` whose state lives in workdir/state. workspace: the folder the
    server opens (default: workdir); uris: each session's document (default: new files in workdir); options:
    settings over the bench's. With `repoIndex` on, typing starts once the index of the workspace is built."""
    from pygls.lsp.client import LanguageClient

    env = {**os.environ, "SPECDEC_STATE_DIR": str(workdir / "state")}
    client = LanguageClient("specdec-editor-bench", "1.0")
    await client.start_io(sys.executable, "-m", "specdec.cli", "serve", env=env)
    options = {**server_options(args), **(options or {})}
    folder = workspace or workdir
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=False)),
        initialization_options=options, root_uri=folder.as_uri(),
        workspace_folders=[types.WorkspaceFolder(folder.as_uri(), "bench")]))
    client.initialized(types.InitializedParams())
    while True:  # models load in the background; wait so typing meets a ready server
        stats = await client.protocol.send_request_async("specdec/stats", {})
        if stats.model.state in ("ready", "failed"):
            break
        await asyncio.sleep(0.5)
    if stats.model.state == "failed":
        raise RuntimeError(f"server could not load the models: {stats.model.error}")
    if options.get("repoIndex"):
        index = await wait_for_index(client)
        print(f"  repository index: {index.files} files, {index.tokens} tokens, built in {index.build_seconds:.1f} s",
              flush=True)
    records: list[ClientRecord] = []
    for n, session in enumerate(sessions):
        print(f"  typing {len(session.typed)} characters of {session.language} ({session.path})", flush=True)
        replay = Replay(client, session.language)
        await replay.run(session, uris[n] if uris else (workdir / f"{n}-{session.path}").as_uri(), seed=n)
        records.extend(replay.records)
    stats = await client.protocol.send_request_async("specdec/stats", {})  # after the typing: the index included
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return records, plain(stats)


def plain(value):
    """pygls's nested namedtuples as JSON-ready dicts and lists (json.dumps would write a namedtuple as a list)."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


async def wait_for_index(client, timeout: float = 3600.0):
    """The server's repository index stats once its build is done (RuntimeError if it failed or never ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        index = (await client.protocol.send_request_async("specdec/stats", {})).repo_index
        if index.state == "ready" and index.files and getattr(index, "settled", True):  # everything recorded is in
            return index
        if index.state in ("failed", "off"):
            raise RuntimeError(f"the repository index is {index.state}: {getattr(index, 'last_error', '')}")
        await asyncio.sleep(0.5)
    raise RuntimeError("the repository index was not built in time")


def summarize(client_records: list[ClientRecord], server_records: list[dict]) -> dict:
    languages = sorted({r.language for r in client_records})
    out = {}
    for language in languages + ["(all)"]:
        mine = [r for r in client_records if language in ("(all)", r.language)]
        theirs = [r for r in server_records if r.get("kind") == "request" and language in ("(all)", r["language"])]
        hits = [r for r in theirs if r["source"] in ("cache", "typeahead")]
        model = [r for r in theirs if r["source"] == "model"]
        consecutive = [r for r in model if r["prefill_reused"] > 0]  # not a session's cold first prompt
        reused = sum(r["prefill_reused"] for r in consecutive)
        computed = sum(r["prefill_computed"] for r in consecutive)
        served_rt = [(r.done - r.sent) * 1000 for r in mine if r.status == "served"]
        out[language] = {
            "sent": len(mine),
            "cancelled": sum(r.status == "cancelled" for r in mine),
            "served": sum(r.status == "served" for r in mine),
            "empty": sum(r.status == "empty" for r in mine),
            "cache_hits": sum(r["source"] == "cache" for r in theirs),
            "typeahead_hits": sum(r["source"] == "typeahead" for r in theirs),
            "hit_rate": len(hits) / len(theirs) if theirs else None,
            "hit_p50_ms": percentile([r["latency_ms"] for r in hits], 0.5),
            "hit_p95_ms": percentile([r["latency_ms"] for r in hits], 0.95),
            "model_p50_ms": percentile([r["latency_ms"] for r in model], 0.5),
            "model_p95_ms": percentile([r["latency_ms"] for r in model], 0.95),
            "client_served_p50_ms": statistics.median(served_rt) if served_rt else None,
            "prefill_reused": reused,
            "prefill_computed": computed,
            "prefill_reuse_rate": reused / (reused + computed) if reused + computed else None,
        }
    return out


def print_table(summary: dict) -> None:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    cols = ("sent", "cancel", "served", "cache", "t-ahead", "hit%", "hit p50", "hit p95", "model p50", "model p95",
            "rtt p50", "reused")
    print("\n" + f"{'language':12} " + " ".join(f"{c:>9}" for c in cols))
    for language, s in summary.items():
        cells = [s["sent"], s["cancelled"], s["served"], s["cache_hits"], s["typeahead_hits"],
                 f(s["hit_rate"], ".0%"), f(s["hit_p50_ms"], ".1f"), f(s["hit_p95_ms"], ".1f"),
                 f(s["model_p50_ms"], ".0f"), f(s["model_p95_ms"], ".0f"), f(s["client_served_p50_ms"], ".1f"),
                 f(s["prefill_reuse_rate"], ".0%")]
        print(f"{language:12} " + " ".join(f"{c:>9}" for c in cells))
    print("(latencies in ms; hit/model: server side, request received -> suggestion ready; rtt p50: client-side "
          "round trip of served requests (hits and model answers), JSON-RPC included; reused: prompt tokens served "
          "from the KV cache on consecutive keystrokes)")


def register(parser):
    """`specdec bench --editor` and its flags (`--repo DIR` is the bench's); the runner answers None unless --editor
    was given."""
    parser.add_argument("--editor", action="store_true",
                        help="latency benchmark instead: replay typing sessions against `specdec serve` over stdio "
                             "and against llama.cpp's llama-server /infill")
    parser.add_argument("--sessions", type=int, default=0,
                        help="--editor: at most this many typing sessions (0: all)")
    parser.add_argument("--editor-servers", default=",".join(SERVERS),
                        help="--editor: comma-separated, which servers to replay against: specdec, llama")
    return lambda args: run(args) if args.editor else None


def server_options(args) -> dict:
    """The initializationOptions `specdec serve` gets: the command line's models and budgets."""
    options = {"target": args.target, "draft": args.draft, "dtype": args.dtype, "draftQuant": args.draft_quant,
               "maxNewTokens": args.max_new_tokens, "maxDraft": args.max_draft}
    if getattr(args, "target_quant", None):
        options["targetQuant"] = args.target_quant
    if getattr(args, "forward", None):
        options["forward"] = args.forward
    if getattr(args, "fim_order", None):
        options["fimOrder"] = args.fim_order
    return options


def replay_llama(args, sessions: list[TypingSession]) -> tuple[list[editor_llama.LlamaRecord], dict] | None:
    """The same keystrokes against llama-server /infill on the target's GGUF; None (said why) if it cannot run."""
    try:
        settings = Settings().update(server_options(args))
    except SettingsError as exc:
        raise SpecdecError(str(exc)) from None
    files = infill_files(settings, "the llama-server replay")
    if files is None:
        return None
    binary, gguf = files
    rules = InfillRules.load(settings)
    print(f"{len(sessions)} typing sessions against llama-server /infill ({gguf.name}; {settings.max_new_tokens} "
          f"tokens, prompt window {settings.max_prefix_tokens}/{settings.max_suffix_tokens} tokens)", flush=True)
    records: list[editor_llama.LlamaRecord] = []
    with infill_server(binary, gguf, "the llama-server replay") as anchor:
        if anchor is None:
            return None
        server = anchor.server
        for n, session in enumerate(sessions):
            print(f"  typing {len(session.typed)} characters of {session.language} ({session.path})", flush=True)
            replay = editor_llama.LlamaReplay(server.port, rules, session.language)
            asyncio.run(replay.run(session.before, session.typed, session.after,
                                   keystroke_delays(session.typed, seed=n)))
            records.extend(replay.records)
        peak = server.peak_rss_mb()
    return records, {"gguf": str(gguf), "peak_rss_mb": peak, "repack": anchor.repack}


def repo_sessions(spec: str, limit: int, workspace: Path) -> tuple[list[TypingSession], list[str], dict]:
    """Typing sessions in the held-out files of a repository (a folder or a pinned package), the split the fine-tune
    uses, and a copy of its other files in `workspace`: the server indexes those, and the typed file is one it has
    never seen. Returns the sessions, their documents' URIs (new files of the workspace) and what was chosen."""
    import shutil

    from specdec_bench.workload import SourceFile, repo_root
    from specdec.prompts.languages import EXTENSIONS
    from specdec.repository.files import select, split_heldout

    root = repo_root(spec)
    selection = select(root)
    train, heldout = split_heldout(selection.files)
    for rel in train:
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, workspace / rel)
    sessions, uris = [], []
    for rel in heldout:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        source = SourceFile(EXTENSIONS.get(rel.suffix.lower(), "plaintext"), "local", f"repo:{rel.as_posix()}",
                            rel.as_posix(), "", "")
        try:
            sessions.append(TypingSession.from_source(source, text))
        except IndexError:  # too short to cut a few lines from
            continue
        uris.append((workspace / rel).as_uri())
        if limit and len(sessions) == limit:
            break
    if not sessions:
        raise SpecdecError(f"--repo {spec}: none of its {len(heldout)} held-out files is long enough to type in")
    return sessions, uris, {"repo": spec, "root": str(root), "indexed_files": len(train),
                            "heldout_files": [rel.as_posix() for rel in heldout]}


def run_repo(args) -> int:
    """The replay in a repository's held-out files against `specdec serve`, without and then with the server's index
    of its other files (llama-server has no repository index: not replayed here)."""
    specs = [p.strip() for v in args.repo for p in v.split(",") if p.strip()]
    if len(specs) != 1:
        raise SpecdecError("--editor --repo takes one folder or pinned package")
    runs, requests, indexes = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="specdec-editor-") as tmp:
        workspace = Path(tmp) / "workspace"
        sessions, uris, chosen = repo_sessions(specs[0], args.sessions, workspace)
        print(f"{len(sessions)} typing sessions in held-out files of {specs[0]} ({chosen['indexed_files']} other "
              f"files in the workspace) against `specdec serve` ({args.target}, draft {args.draft})", flush=True)
        for label, index in (("no index", False), ("index", True)):
            print(f"\n== {label}", flush=True)
            workdir = Path(tmp) / label.replace(" ", "-")
            workdir.mkdir()
            client_records, final_stats = asyncio.run(replay_all(args, sessions, workdir, workspace, uris,
                                                                 {"repoIndex": index}))
            requests[label] = load_records(workdir / "state" / "metrics.jsonl")
            runs[label] = summarize(client_records, requests[label])
            indexes[label] = final_stats.get("repo_index")
    for label, summary in runs.items():
        print(f"\n{label}:", end="")
        print_table(summary)
    before, after = runs["no index"]["(all)"]["model_p50_ms"], runs["index"]["(all)"]["model_p50_ms"]
    if before and after:
        print(f"\nmodel-request p50: {before:.0f} ms without the index, {after:.0f} ms with it "
              f"({after / before - 1:+.0%})")
    out = Path(args.output if args.output != "bench-results/bench.json" else "bench-results/editor-repo.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"repo": chosen, "runs": runs, "repo_index": indexes, "options": server_options(args),
                               "sessions": [{"language": s.language, "file": uri, "typed": s.typed}
                                            for s, uri in zip(sessions, uris)],
                               "requests": requests}, indent=2))
    print(f"wrote {out}")
    return 0


def run(args) -> int:
    if getattr(args, "repo", None):
        return run_repo(args)
    servers = [x.strip() for x in getattr(args, "editor_servers", ",".join(SERVERS)).split(",") if x.strip()]
    if not servers or set(servers) - set(SERVERS):
        raise SpecdecError(f"--editor-servers takes {', '.join(SERVERS)}, not {','.join(servers)!r}")
    languages = [x.strip() for x in args.languages.split(",") if x.strip()] or None
    sources = [s for s in SOURCES if not languages or s.language in languages]
    if args.sessions:
        sources = sources[: args.sessions]
    sessions = [TypingSession.from_source(s, fetch(s)) for s in sources]
    summary, final_stats, server_records, comparison = {}, None, [], {}
    if "specdec" in servers:
        with tempfile.TemporaryDirectory(prefix="specdec-editor-") as tmp:
            workdir = Path(tmp)
            print(f"{len(sessions)} typing sessions against `specdec serve` ({args.target}, draft {args.draft})",
                  flush=True)
            client_records, final_stats = asyncio.run(replay_all(args, sessions, workdir))
            server_records = load_records(workdir / "state" / "metrics.jsonl")
        summary = summarize(client_records, server_records)
        print_table(summary)
        comparison["specdec serve"] = editor_llama.summarize_ours(client_records, server_records)
    llama_run = replay_llama(args, sessions) if "llama" in servers else None
    if llama_run is not None:
        comparison["llama-server /infill"] = editor_llama.summarize_llama(llama_run[0])
    if comparison:
        editor_llama.print_comparison(comparison)
    out = Path(args.output if args.output != "bench-results/bench.json" else "bench-results/editor.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "comparison": comparison, "server_stats": final_stats,
                               "options": server_options(args),
                               "sessions": [{"language": s.language, "file": s.path, "typed": s.typed}
                                            for s in sessions],
                               "requests": server_records,
                               "llama": None if llama_run is None else {
                                   **llama_run[1], "requests": [asdict(r) for r in llama_run[0]]}}, indent=2))
    print(f"wrote {out}")
    return 0
