"""A pass trace for people: the completion once more, each token marked by what produced it, then a table
of the passes and, per source, the acceptance the papers' formula expects beside what was measured.

It reads the trace's JSON (`Trace.as_dict(decode)`: the shape `specdec complete --trace-json` writes and
the server's `specdec/trace` returns), so a recorded trace renders the same as a fresh one.

Markers when the output is not a terminal (with colours in one, NO_COLOR respected):

    [draft:…]       accepted tokens the draft model proposed (with the adapter the header names, if any)
    [lookup:…]      accepted tokens prompt lookup proposed
    [index:…]       accepted tokens the repository index proposed
    {bonus:…}       the target's token after a fully accepted branch (drawn from p)
    <correction:…>  the target's token in place of rejected drafts (from norm(max(0, p − q)), or the argmax)
    ~…~             the drafts rejected there, before the correction (branches of a tree separated by |)
    unmarked        the target alone: the prefill pass, or a pass with nothing drafted
"""

from __future__ import annotations

import os

from specdec.engine.trace import BONUS, CORRECTION, PLAIN, source_kind

ACCEPTED = "accepted"
REJECTED = "rejected"

MARKERS = {  # kind (or accepted source kind) -> (open, close) when not a terminal
    "draft": ("[draft:", "]"), "lookup": ("[lookup:", "]"), "index": ("[index:", "]"),
    BONUS: ("{bonus:", "}"), CORRECTION: ("<correction:", ">"), REJECTED: ("~", "~"), PLAIN: ("", ""),
}
COLOURS = {  # the same kinds in a terminal (ANSI SGR)
    "draft": "32", "lookup": "36", "index": "35", BONUS: "1;33", CORRECTION: "1;31", REJECTED: "2;9", PLAIN: "",
}
LEGEND = [("draft", "draft model"), ("lookup", "prompt lookup"), ("index", "repository index"),
          (BONUS, "bonus"), (CORRECTION, "correction"), (REJECTED, "rejected drafts")]
RESET = "\x1b[0m"


def segments(trace: dict) -> list[tuple[str, str]]:
    """The completion as (style, text) runs, in order: style is an accepted token's source kind ('draft',
    'lookup', 'index'), BONUS, CORRECTION, PLAIN or REJECTED (text the completion does not contain). Without
    the rejected runs the texts join to the completion's text."""
    pieces, budget = trace["pieces"], len(trace["text"])
    out: list[tuple[str, str]] = []
    position = 0

    def emit(style: str, text: str) -> None:
        nonlocal budget
        if style != REJECTED:
            text, budget = text[:budget], budget - len(text[:budget])
        if not text:
            return
        if out and out[-1][0] == style and style in ("draft", "lookup", "index", PLAIN):
            out[-1] = (style, out[-1][1] + text)
        else:
            out.append((style, text))

    for record in trace["passes"]:
        sources, texts = record["sources"], record["node_text"]
        last = -1
        for node in record["path"]:
            if position >= len(pieces):
                break
            emit(source_kind(sources[node]), pieces[position])
            last, position = node, position + 1
        if position >= len(pieces) or budget <= 0:
            break
        if record["next"] == CORRECTION:
            branches = [_branch_text(record, child, texts) for child in _children(record, last)]
            emit(REJECTED, "|".join(branches))
        emit(record["next"], pieces[position])
        position += 1
    return out


def _children(record: dict, node: int) -> list[int]:
    return [i for i, parent in enumerate(record["parents"]) if parent == node]


def _branch_text(record: dict, node: int, texts: list[str]) -> str:
    """A rejected node and what was drafted after it along its first children: the continuation it proposed."""
    text = texts[node]
    children = _children(record, node)
    while children:
        text += texts[children[0]]
        children = _children(record, children[0])
    return text


def render_text(trace: dict, colour: bool) -> str:
    """The completion, each run marked (colour: ANSI colours instead of the text markers)."""
    parts = []
    for style, text in segments(trace):
        if colour:
            code = COLOURS[style]
            parts.append(f"\x1b[{code}m{text}{RESET}" if code else text)
        else:
            opening, closing = MARKERS[style]
            parts.append(f"{opening}{text}{closing}")
    return "".join(parts)


def legend(colour: bool) -> str:
    if colour:
        return "  ".join(f"\x1b[{COLOURS[style]}m{name}{RESET}" for style, name in LEGEND) + "  plain: the target alone"
    return ("[draft:…] draft model  [lookup:…] prompt lookup  [index:…] repository index  {bonus:…}  "
            "<correction:…>  ~…~ rejected drafts  unmarked: the target alone")


def _short(text: str, width: int = 14) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 2] + "…" + shown[-1]


def pass_table(trace: dict) -> str:
    """One line per target pass: what was drafted, by whom, the plan, how much was kept, the next token."""
    lines = [f"{'pass':>4}  {'drafted':>7}  {'depth':>5}  {'plan':>6}  {'sources':<18}{'accepted':>8}  "
             f"{'next':<10}  {'token':<16}{'draft ms':>9}  {'verify ms':>9}"]
    for i, r in enumerate(trace["passes"]):
        names = sorted({source_kind(s) for s in r["sources"]})
        sources = "prefill" if r["prefill"] else ",".join(names) or "-"
        plan = "-" if r["plan"] is None else f"{len(r['plan']['parents'])}n"
        token = _short(r.get("next_text", str(r["next_token"])))
        lines.append(f"{i:>4}  {len(r['tokens']):>7}  {r['depth']:>5}  {plan:>6}  {sources:<18}"
                     f"{len(r['path']):>8}  {r['next']:<10}  {token:<16}{r['draft_ms']:>9.2f}  {r['verify_ms']:>9.2f}")
    return "\n".join(lines)


def summary_table(trace: dict) -> str:
    """Per source: measured acceptance α, average draft length k, (1 − α^(k+1)) / (1 − α), measured tokens per pass."""
    summary = trace["summary"]
    lines = [f"{'source':<12}{'passes':>7}{'drafted':>9}{'accepted':>10}{'alpha':>8}{'k':>7}"
             f"{'expected':>10}{'measured':>10}   (tokens per pass)"]
    rows = [(row["source"], row) for row in summary["sources"]] + [("all", summary["all"])]
    for name, row in rows:
        lines.append(f"{name:<12}{row['passes']:>7}{row['drafted']:>9}{row['accepted']:>10}{row['alpha']:>8.2f}"
                     f"{row['k']:>7.2f}{row['expected_tokens_per_pass']:>10.2f}{row['measured_tokens_per_pass']:>10.2f}")
    lines.append(f"every pass, prefill and plain steps included: {summary['target_passes']} passes, "
                 f"{summary['tokens_per_pass']:.2f} tokens per pass")
    return "\n".join(lines)


def render(trace: dict, colour: bool = False) -> str:
    """The whole report: header, legend, the marked completion, the pass table, the summary."""
    adapter = trace.get("adapter") or "none"
    header = (f"trace: strategy {trace['strategy'] or '-'}, draft adapter {adapter}, {trace['prompt_tokens']} prompt "
              f"tokens, {trace['new_tokens']} new ({trace['stop_reason']}), {len(trace['passes'])} target passes")
    return "\n".join([header, legend(colour), "", render_text(trace, colour), "", pass_table(trace), "",
                      summary_table(trace)]) + "\n"


def wants_colour(stream) -> bool:
    """Colours on a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")
