"""What each target pass of a completion did: the record the statistics are folded from.

One `PassRecord` per target pass (the prefill pass, which yields the first token, included):
the drafted tree (tokens, parents, each node's source), the accepted path, the next token and
how it was chosen, the planned shape, the draft and verify time. A `Trace` is a completion's
records plus what its prefill reused; `GenerationStats` (session.py) and the per-source counters
are folds of it, computed once at the end (vLLM's SpecDecodingStats feeding logging and
Prometheus is the model), so the counters and the trace cannot disagree.

Recording is always on and costs a few references per pass: the tree's own lists are kept, not
copied. The target's p and the draft's q of each drafted token need a softmax over the vocabulary,
so they are recorded only when `GenerationConfig(trace=True)` asks.

The tokens of the trace rebuild the completion: every pass yields its accepted tokens and then
its next token; the completion is the first `new_tokens` of that stream (the rest is a stop token
or what the stop rule cut off).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.engine.acceptance import expected_tokens_per_pass
from specdec.engine.tree import DETERMINISTIC, ROOT, TokenTree

BONUS = "bonus"  # every drafted token on the path was accepted (a leaf was reached): next drawn from p
CORRECTION = "correction"  # a drafted token was rejected: next drawn from norm(max(0, p - q)), or the argmax
PLAIN = "plain"  # nothing was drafted (the prefill pass, or a step the drafter sat out): next drawn from p
NEXT_KINDS = (BONUS, CORRECTION, PLAIN)

# drafter names -> what produced the token, as the trace's readers show it
SOURCE_KINDS = {"draft": "draft", "draft-tree": "draft", "lookup": "lookup", "lookup-tree": "lookup",
                "repo": "index", "edit": "lookup"}  # edit: the next-edit window copied (edit_window.py)


def source_kind(source: str) -> str:
    """'draft' (the draft model), 'lookup' (prompt lookup) or 'index' (the repository index); unknown names as given."""
    return SOURCE_KINDS.get(source, source)


def credit(source: str, sources: list[str] | None, drafted: int, path: list[int]) -> dict[str, tuple[int, int]]:
    """{source: (nodes drafted, nodes accepted)} of one pass: per node for a merged tree (sources),
    else everything to `source`. The one rule the per-source counters and Draft.credit share."""
    if sources is None:
        return {source: (drafted, len(path))} if drafted else {}
    out: dict[str, tuple[int, int]] = {}
    for name in sources:
        n, accepted = out.get(name, (0, 0))
        out[name] = (n + 1, accepted)
    for node in path:
        n, accepted = out[sources[node]]
        out[sources[node]] = (n, accepted + 1)
    return out


@dataclass(slots=True)
class PassRecord:
    """One target pass. Node i of the drafted tree is tokens[i], hanging under parents[i] (-1: the root,
    the last verified token); the lists are the tree's own, never modified."""

    tokens: list[int]  # drafted nodes' tokens, node order ([] when nothing was drafted)
    parents: list[int]
    source: str  # the drafter that proposed the tree ("" when nothing was drafted)
    sources: list[str] | None  # a merged tree's per-node sources (None: every node is `source`'s)
    path: list[int]  # accepted node indices, root's child first
    next_token: int  # the target's own token after the accepted path
    next: str  # BONUS | CORRECTION | PLAIN
    depth: int  # the drafted tree's longest path (a chain's length)
    draft_seconds: float
    verify_seconds: float
    prefill: bool = False  # the prompt's pass: verify_seconds is the target's prefill, draft_seconds the drafter's
    plan: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # the planner's shape: (parents, ranks); None: unplanned
    p: list[float] | None = None  # per node: the target's probability of its token after its parent (trace=True)
    q: list[float] | None = None  # per node: the draft's (1.0 for a deterministic child: lookup, index, top-k)

    @property
    def drafted(self) -> int:
        return len(self.tokens)

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def node_sources(self) -> list[str]:
        return list(self.sources) if self.sources is not None else [self.source] * len(self.tokens)

    @property
    def accepted_tokens(self) -> list[int]:
        return [self.tokens[i] for i in self.path]

    @property
    def yielded(self) -> list[int]:
        """The tokens this pass added to the stream: the accepted path, then the next token."""
        return self.accepted_tokens + [self.next_token]

    def credit(self) -> dict[str, tuple[int, int]]:
        return credit(self.source, self.sources, len(self.tokens), self.path)

    def levels(self) -> dict[str, tuple[int, int]]:
        """{source: (levels checked, levels drafted)} of one pass, for α and k. The target checked a source at a
        level where one of its nodes hangs under the root or an accepted node (once per level, however many
        siblings it offered there): accepted if the path goes through its node, rejected otherwise. A source's
        draft length is the number of levels its nodes occupy (a chain's length)."""
        sources = self.node_sources
        node_depth: list[int] = []
        for parent in self.parents:
            node_depth.append(1 if parent == ROOT else node_depth[parent] + 1)
        reached = {ROOT, *self.path}
        checked: dict[str, set[int]] = {}
        drafted: dict[str, set[int]] = {}
        for i, name in enumerate(sources):
            drafted.setdefault(name, set()).add(node_depth[i])
            if self.parents[i] in reached:
                checked.setdefault(name, set()).add(node_depth[i])
        return {name: (len(checked.get(name, ())), len(levels)) for name, levels in drafted.items()}

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def as_dict(self) -> dict:
        return {"prefill": self.prefill, "tokens": list(self.tokens), "parents": list(self.parents),
                "sources": self.node_sources, "path": list(self.path), "next_token": self.next_token,
                "next": self.next, "depth": self.depth,
                "plan": None if self.plan is None else {"parents": list(self.plan[0]), "ranks": list(self.plan[1])},
                "p": self.p, "q": self.q, "draft_ms": round(self.draft_seconds * 1000, 3),
                "verify_ms": round(self.verify_seconds * 1000, 3)}


def next_kind(tree: TokenTree, bonus: bool) -> str:
    """How the verdict chose the next token: nothing drafted, all of a branch accepted, or a rejection corrected."""
    if not len(tree):
        return PLAIN
    return BONUS if bonus else CORRECTION


def probabilities_of(tree: TokenTree, target_probs: torch.Tensor) -> tuple[list[float], list[float]]:
    """(p, q) per node: target_probs [len(tree) + 1, vocab] (the sampling law; row j: after position j)
    at the node's token after its parent, and the law the node was drawn from there (1.0: deterministic)."""
    rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long)
    tokens = torch.tensor(tree.tokens, dtype=torch.long)
    p = target_probs[rows, tokens].tolist() if len(tree) else []
    q = [1.0] * len(tree)
    if tree.child_probs is not None:
        for i, parent in enumerate(tree.parents):
            if tree.drawn[parent + 1] != DETERMINISTIC:
                row = tree.child_probs[parent + 1]
                q[i] = float(row[tree.tokens[i]]) if tree.tokens[i] < row.shape[-1] else 0.0
    return p, q


@dataclass
class SourceSummary:
    """Theory beside practice for one source (or all): the measured acceptance α, the average draft depth k,
    what the i.i.d. model of the papers predicts a pass yields, (1 − α^(k+1)) ÷ (1 − α), and what its passes
    yielded: 1 + accepted ÷ passes.

    α is the papers' per-token acceptance: accepted ÷ checked, where a pass checks the levels its accepted path
    reached plus the one it stopped at (a chain's tokens after its first rejection were never checked, and a
    tree's siblings of an accepted node compete for one level: counting them as rejections would put α below
    the rate the formula assumes). k is the depth drafted (a chain's length), not the nodes."""

    passes: int
    drafted: int  # nodes
    accepted: int
    checked: int = 0  # levels the target examined: accepted + one per pass that stopped at a rejection
    depth: int = 0  # levels drafted (a chain's length; a tree's depth), summed over passes

    @property
    def alpha(self) -> float:
        return self.accepted / self.checked if self.checked else 0.0

    @property
    def k(self) -> float:
        return self.depth / self.passes if self.passes else 0.0

    @property
    def expected(self) -> float:
        return expected_tokens_per_pass(self.alpha, self.k) if self.passes else 0.0

    @property
    def measured(self) -> float:
        return 1 + self.accepted / self.passes if self.passes else 0.0

    def add(self, drafted: int, accepted: int, checked: int, depth: int) -> None:
        self.passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.checked += checked
        self.depth += depth

    def as_dict(self) -> dict:
        return {"passes": self.passes, "drafted": self.drafted, "accepted": self.accepted, "checked": self.checked,
                "alpha": round(self.alpha, 4), "k": round(self.k, 4), "expected_tokens_per_pass": round(self.expected, 4),
                "measured_tokens_per_pass": round(self.measured, 4)}


@dataclass
class Trace:
    """A completion's passes, and the facts of its prompt. The stats are folds of it."""

    prompt_tokens: int
    strategy: str = ""
    adapter: str = ""  # name@version of the draft's adapter ("": the base draft); set by whoever switched it
    passes: list[PassRecord] = field(default_factory=list)
    new_tokens: int = 0
    stop_reason: str = ""
    text: str = ""
    probabilities: bool = False  # whether p and q were recorded
    prefill_reused: int = 0
    prefill_computed: int = 0
    draft_prefill_reused: int = 0
    draft_prefill_computed: int = 0
    prefill_seconds: float = 0.0
    seconds: float = 0.0

    # -- the stream -------------------------------------------------------------------
    def stream(self) -> list[int]:
        """Every token the passes yielded, in order."""
        return [token for record in self.passes for token in record.yielded]

    def tokens(self) -> list[int]:
        """The completion's tokens, rebuilt from the passes."""
        return self.stream()[: self.new_tokens]

    # -- folds --------------------------------------------------------------------------
    @property
    def target_passes(self) -> int:
        return len(self.passes)

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.passes)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.passes)

    @property
    def drafted_depth(self) -> int:
        return sum(r.depth for r in self.passes)

    @property
    def tree_passes(self) -> int:
        return sum(r.drafted > r.depth for r in self.passes)

    @property
    def draft_seconds(self) -> float:
        return sum((r.draft_seconds for r in self.passes if not r.prefill), 0.0)

    @property
    def verify_seconds(self) -> float:
        return sum((r.verify_seconds for r in self.passes if not r.prefill), 0.0)

    @property
    def produced(self) -> int:
        return self.new_tokens + (self.stop_reason == "eos")

    def by_source(self) -> dict[str, SourceSummary]:
        """Per drafter source: passes that verified a draft of it (a merged tree's pass counts for each source
        in it), its nodes drafted and accepted."""
        out: dict[str, SourceSummary] = {}
        for record in self.passes:
            levels = record.levels()
            for source, (drafted, accepted) in record.credit().items():
                checked, depth = levels[source]
                out.setdefault(source, SourceSummary(0, 0, 0)).add(drafted, accepted, checked, depth)
        return out

    def overall(self) -> SourceSummary:
        """Every pass that verified a draft, whatever its source."""
        summary = SourceSummary(0, 0, 0)
        for record in self.passes:
            if record.drafted:
                end = record.path[-1] if record.path else ROOT
                stopped = end in record.parents  # a rejection ended the path below a drafted level
                summary.add(record.drafted, record.accepted, record.accepted + stopped, record.depth)
        return summary

    def summary(self) -> dict:
        return {"sources": [{"source": name, **s.as_dict()} for name, s in sorted(self.by_source().items())],
                "all": self.overall().as_dict(), "target_passes": self.target_passes,
                "tokens_per_pass": round(self.produced / self.target_passes, 4) if self.passes else 0.0}

    def as_dict(self, decode=None) -> dict:
        """The JSON of `specdec complete --trace-json` and the server's `specdec/trace`. decode (a tokenizer's
        decode) adds the text of every token: `pieces` for the completion's tokens and, per pass, `node_text`
        for each drafted node (in the context of its branch) and `next_text`."""
        out = {"strategy": self.strategy, "adapter": self.adapter, "prompt_tokens": self.prompt_tokens,
               "new_tokens": self.new_tokens, "stop_reason": self.stop_reason, "text": self.text,
               "tokens": self.tokens(), "probabilities": self.probabilities,
               "prefill": {"reused": self.prefill_reused, "computed": self.prefill_computed,
                           "draft_reused": self.draft_prefill_reused, "draft_computed": self.draft_prefill_computed,
                           "ms": round(self.prefill_seconds * 1000, 3)},
               "ms": round(self.seconds * 1000, 3),
               "passes": [r.as_dict() for r in self.passes], "summary": self.summary()}
        if decode is not None:
            out["pieces"] = token_pieces(self.tokens(), decode)
            for record, entry in zip(self.passes, out["passes"]):
                entry["node_text"] = node_texts(record, decode)
                entry["next_text"] = decode([record.next_token])
        return out


def token_pieces(tokens: list[int], decode) -> list[str]:
    """Each token's share of the decoded text (joined, they are decode(tokens)): a byte-level token that ends
    inside a character gets "" and the one that completes it the character (as streaming detokenizers hold back
    a trailing U+FFFD; an invalid byte inside the text stays U+FFFD, and is the token's that is followed)."""
    pieces, before = [], ""
    for i in range(len(tokens)):
        text = decode(tokens[: i + 1])
        if text.startswith(before) and not text.endswith("\ufffd"):
            pieces.append(text[len(before):])
            before = text
        else:
            pieces.append("")
    if pieces:
        pieces[-1] += decode(tokens)[len(before):] if decode(tokens).startswith(before) else ""
    return pieces


def node_texts(record: PassRecord, decode) -> list[str]:
    """Each drafted node's text, decoded after its branch (so a token's leading space or split character reads right)."""
    out = []
    for i in range(record.drafted):
        branch, node = [], i
        while node != ROOT:
            branch.append(record.tokens[node])
            node = record.parents[node]
        branch.reverse()
        full, before = decode(branch), decode(branch[:-1])
        out.append(full[len(before):] if full.startswith(before) else decode(branch[-1:]))
    return out
