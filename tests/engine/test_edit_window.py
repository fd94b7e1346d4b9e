"""The edit drafter (specdec/engine/drafters/edit_window.py): it finds the current window in a next-edit prompt, copies
it from the output's aligned position, re-aligns after an insertion, a deletion or a replacement, and a session
drafting with it (alone, or in front of prompt lookup and the draft model) writes exactly what plain greedy
decoding writes: on a rule-based target that edits the window (where the copies are accepted, whole lines a pass)
and on the tiny random transformers model (where they are mostly rejected)."""

import pytest
import torch

from specdec.engine.cost_curve import CostCurve
from specdec.engine.draft_length import DraftLength
from specdec.engine.cached_lm import PrefixSync
from specdec.engine.drafters.composite import Composite
from specdec.engine.drafters.edit_window import EditMarkers, EditWindow, window_tokens, with_edit_window
from specdec.engine.session import GenerationConfig, Session, greedy_reference
from specdec.engine.strategies import NEXT_EDIT_STRATEGIES, STRATEGIES, make_session, next_edit_base
from specdec.engine.tree import ROOT

SEP, NL, EOS, VOCAB = 99, 98, 0, 128
MARKERS = EditMarkers(SEP, (NL,))
# the current window: three "lines" of tokens, each ended by NL
WINDOW = [10, 11, 12, 13, NL, 20, 21, 22, 23, 24, NL, 30, 31, 32, NL, 40, 41, 42, 43, 44, 45, NL]
PROMPT = [1, 2, SEP, 50, NL, 7, 8, NL, SEP, 51, 52, NL] + WINDOW + [SEP, 53, 52, NL]


def test_the_window_is_found_between_the_last_two_separators():
    assert window_tokens(PROMPT, MARKERS) == WINDOW
    assert window_tokens(PROMPT[:8], MARKERS) is None  # one separator: no next-edit prompt
    assert window_tokens([SEP, 51, SEP], MARKERS) is None  # no header line
    assert window_tokens([SEP, 5, 6, 5, NL, SEP], EditMarkers(SEP, (6, 5, NL))) == []  # a header of several tokens


def fixed():
    """The drafter with its chain always as long as asked (its own length adapts to acceptance)."""
    return EditWindow(MARKERS, length=DraftLength(k_max=32, draft_cost=0.0, adaptive=False))


def drafts(drafter, output, k=32):
    """What the drafter proposes after each prefix of `output` (the session asks once per pass; here per token)."""
    drafter.prefill(PROMPT)
    return [drafter.propose(PROMPT + output[:i], k).tokens for i in range(len(output) + 1)]


def test_it_copies_from_the_aligned_position_and_realigns_after_an_edit():
    drafter = fixed()
    # unchanged so far: the rest of the window, however far the output has come
    assert drafts(drafter, WINDOW[:6]) == [WINDOW[i:] for i in range(7)]
    # a replacement (12 -> 77): taken for one at once, the copy goes on after the replaced token
    replaced = [10, 11, 77, 13, NL, 20]
    proposals = drafts(drafter, replaced)
    assert proposals[2] == WINDOW[2:] and proposals[3] == WINDOW[3:] and proposals[4] == WINDOW[4:]
    assert proposals[6] == WINDOW[6:]
    # a longer one (12 -> 77 78): the guess fails once, nothing while the tail is new, then the window's next
    # token just ahead re-aligns it
    proposals = drafts(drafter, [10, 11, 77, 78, 13, NL, 20])
    assert proposals[3] == WINDOW[3:] and proposals[4] == [] and proposals[5] == WINDOW[4:]
    assert proposals[6] == WINDOW[5:]
    # a token far from where the output was does not re-align alone
    assert drafts(drafter, [10, 11, 77, 78, 44])[5] == []
    # an inserted line (60 61 NL after the first line): re-aligned after it, on the second line's first 2-gram
    inserted = WINDOW[:5] + [60, 61, NL] + WINDOW[5:8]
    proposals = drafts(drafter, inserted)
    assert proposals[5] == WINDOW[5:] and proposals[6] == WINDOW[6:] and proposals[7] == [] and proposals[8] == []
    assert proposals[9] == WINDOW[6:] and proposals[10] == WINDOW[7:] and proposals[11] == WINDOW[8:]
    # a deleted line (the second): the output skips ahead and the copy follows it
    deleted = WINDOW[:5] + WINDOW[11:14]
    proposals = drafts(drafter, deleted)
    assert proposals[6] == WINDOW[12:] and proposals[7] == WINDOW[13:]  # at once: the newline before it matches too


def test_realignment_prefers_the_nearest_place_ahead_and_the_longest_match():
    window = [5, 6, 1, 2, 7, NL, 8, 1, 2, 9, NL, 1, 2, 3, NL]
    prompt = [SEP, 50, NL] + window + [SEP, 51, NL]
    drafter = fixed()
    drafter.prefill(prompt)
    out = [5, 6, 1, 2, 7, NL, 8, 4, 1, 2]  # a replacement on the second line, then "1 2": three places in the window
    assert drafter.propose(prompt + out, 32).tokens == [9, NL, 1, 2, 3, NL]  # the one after where it was
    drafter.prefill(prompt)
    out = [5, 6, 4, 2, 3]  # "2 3" is found only at the end: the longest match wins over nearness
    assert drafter.propose(prompt + out, 32).tokens == [NL]


def test_a_prompt_without_a_window_gets_no_drafts_and_k_caps_the_chain():
    drafter = fixed()
    drafter.prefill([1, 2, 3])
    assert drafter.propose([1, 2, 3, 4], 8).tokens == []
    drafter.prefill(PROMPT)
    assert drafter.propose(PROMPT, 4).tokens == WINDOW[:4]


def test_it_goes_in_front_of_a_strategys_drafter():
    from specdec.engine.drafters.prompt_lookup import PromptLookup

    assert isinstance(with_edit_window(None, MARKERS), EditWindow)
    both = with_edit_window(PromptLookup(), MARKERS)
    assert isinstance(both, Composite) and both.name == "edit+lookup"
    assert with_edit_window(both, MARKERS).name == "edit+edit+lookup"  # members flattened, not nested
    assert "edit" in NEXT_EDIT_STRATEGIES and "edit" not in STRATEGIES and "repo" not in NEXT_EDIT_STRATEGIES
    assert next_edit_base("edit") == "draft" and next_edit_base("edit", draft_model=False) == "lookup"
    assert next_edit_base("auto") == "auto" and next_edit_base("plain") == "plain"


class EditingLM(PrefixSync):
    """A rule-based CachedLM that rewrites a next-edit prompt's window with `edit` and ends it with the separator:
    its argmax after any context is the next token of that rewrite (EOS off it). Tree passes score each node on
    its own ancestors, so chains and trees verify as a real model's do."""

    def __init__(self, edit):
        self.edit, self.device = edit, torch.device("cpu")
        self.tokens, self.tree_tokens, self.tree_parents = [], [], []
        self.passes = 0

    def next_token(self, context):
        seps = [i for i, t in enumerate(context) if t == SEP]
        if len(seps) < 3 or NL not in context[seps[-1]:]:
            return EOS
        window = window_tokens(context[: seps[-1] + 1], MARKERS)
        if window is None:
            return EOS
        out = context[context.index(NL, seps[-1]) + 1:]
        target = self.edit(window) + [SEP]
        return target[len(out)] if out == target[: len(out)] and len(out) < len(target) else EOS

    def logits(self, context):
        row = torch.zeros(VOCAB)
        row[self.next_token(context)] = 10.0
        return row

    def reset(self):
        self.tokens, self.tree_tokens, self.tree_parents = [], [], []

    def extend(self, new_tokens, keep_logits=None):
        assert not self.tree_tokens
        self.passes += 1
        rows = []
        for token in new_tokens:
            self.tokens.append(token)
            rows.append(self.logits(self.tokens))
        return torch.stack(rows[-keep_logits:] if keep_logits else rows)

    def extend_tree(self, tokens, parents):
        self.passes += 1
        base = len(self.tree_tokens)
        rows = []
        for i, (token, parent) in enumerate(zip(tokens, parents)):
            self.tree_tokens.append(token)
            self.tree_parents.append(parent)
            path, node = [], base + i
            while node != ROOT:
                path.append(self.tree_tokens[node])
                node = self.tree_parents[node]
            rows.append(self.logits(self.tokens + path[::-1]))
        return torch.stack(rows)

    def keep_path(self, slots):
        self.tokens += [self.tree_tokens[s] for s in slots]
        self.tree_tokens, self.tree_parents = [], []

    def truncate(self, length):
        del self.tokens[length:]
        self.tree_tokens, self.tree_parents = [], []

    def check_tree_attention(self):
        pass


class Tokens:
    eos_token_id = EOS

    def decode(self, ids):
        return " ".join(map(str, ids))


EDITS = {
    "unchanged": lambda w: list(w),
    "rename": lambda w: [77 if t in (12, 31) else t for t in w],  # one token on two lines
    "insert": lambda w: w[:5] + [60, 61, 62, NL] + w[5:],
    "delete": lambda w: w[:5] + w[11:],
    "longer rename": lambda w: [t for x in w for t in ((78, 79) if x in (21, 41) else (x,))],
}


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("fallback", [False, True])
def test_on_a_model_that_edits_the_window_the_copies_are_accepted_and_the_output_is_plain(edit, fallback):
    from specdec.engine.drafters.prompt_lookup import PromptLookup

    expected = EDITS[edit](WINDOW)
    plain = Session(EditingLM(EDITS[edit]), Tokens(), None, {SEP})
    reference = plain.generate(PROMPT, GenerationConfig(max_new_tokens=64))
    assert reference.tokens == expected and reference.stop_reason == "eos"

    drafter = with_edit_window(PromptLookup() if fallback else None, MARKERS, max_draft=16)
    session = Session(EditingLM(EDITS[edit]), Tokens(), drafter, {SEP})
    for _ in range(2):  # the second time from the session's cache
        out = session.generate(PROMPT, GenerationConfig(max_new_tokens=64, max_draft=16))
        assert out.tokens == expected and out.stop_reason == "eos"
        limit = 3 if edit == "unchanged" else reference.stats.target_passes // 2  # the prefill, then 16 a pass
        assert out.stats.target_passes <= limit, out.stats
        assert out.stats.accepted_by["edit"] >= len(expected) - 8


# -------------------------------------------------------------------------- the tiny random model, next-edit prompts

# a flat verify curve, so auto's planner drafts rather than nothing
CURVE = CostCurve((1, 2, 4, 8, 16, 33), (1.0, 1.02, 1.05, 1.1, 1.2, 1.5))
SOURCE = ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
          "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n") * 2
HISTORY = "--- a/p.py\n+++ b/p.py\n@@ -1,2 +1,2 @@\n class Point:\n-    def __init__(self, x):\n+    def __init__(self, x, y):\n"
MAX_NEW = 24


def next_edit_outputs(target, draft, tok, strategy, lines=(2, 9, 17)):
    """(prompt ids, Generation) of a NextEditor on the session for `strategy`, for cursors on several lines; the edit
    drafter re-aligns on any single token here, so it drafts on the random model's output too."""
    from specdec.prompts.next_edit import NextEditor, parse_unified_diff

    session = make_session(target, tok, next_edit_base(strategy, draft is not None), draft, max_draft=16,
                           cost_curve=CURVE)
    editor = NextEditor.for_session(session, strategy, max_draft=16)
    members = session.drafter.members() if hasattr(session.drafter, "members") else (session.drafter,)
    for member in members:
        if isinstance(member, EditWindow):
            member.min_ngram = 1
    history = parse_unified_diff(HISTORY)
    config = GenerationConfig(max_new_tokens=MAX_NEW, max_draft=16)
    results = [editor.predict(SOURCE, line, config, "p.py", history) for line in lines]
    results.append(editor.predict(SOURCE, lines[0], config, "p.py", history))  # again: from the session's cache
    return session, [(r.prompt.ids, r.generation) for r in results]


def check_plain_greedy(target, draft, tok, strategy, reference):
    """Every strategy's outputs equal the plain session's, and those plain greedy decoding's up to its stop."""
    session, outputs = next_edit_outputs(target, draft, tok, strategy)
    _, plain = next_edit_outputs(target, None, tok, "plain")
    drafted = {}
    for (ids, out), (plain_ids, expected) in zip(outputs, plain):
        assert ids == plain_ids
        assert (out.tokens, out.text, out.stop_reason) == (expected.tokens, expected.text, expected.stop_reason)
        greedy = reference(ids, MAX_NEW, session.stop_token_ids)
        assert out.tokens == greedy[: len(out.tokens)] and (out.stop_reason != "eos" or out.tokens == greedy)
        for name, n in out.stats.drafted_by.items():
            drafted[name] = drafted.get(name, 0) + n
    if strategy in ("edit", "auto"):
        assert drafted.get("edit", 0) > 0, f"{strategy}: the edit drafter never drafted ({drafted})"
    if strategy != "plain":
        assert sum(drafted.values()) > 0
    return drafted


@pytest.mark.parametrize("strategy", NEXT_EDIT_STRATEGIES)
def test_next_edit_output_on_the_tiny_model_is_plain_greedy(tok, unrelated_draft, strategy):
    import tiny

    target = tiny.model(seed=0)
    check_plain_greedy(target, unrelated_draft, tok, strategy,
                       lambda ids, n, stops: greedy_reference(target, ids, n, stops))
