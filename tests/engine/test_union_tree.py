"""The `tree` strategy's union of sources: the draft model's planned tree, prompt lookup's and the repository
index's continuations merged into one tree per step, within the planner's budget; lossless (greedy equals
plain greedy, sampling follows the target) and credited per source."""

import pytest
import torch
from sequence_law import pooled_pvalue, three_token_law

from specdec.engine.acceptance import TreeVerdict, verify_tree
from specdec.engine.cost_curve import CostCurve
from specdec.engine.drafters.draft_tree import DraftTree
from specdec.engine.drafters.lookup_tree import LookupTree, as_chain
from specdec.engine.drafters.repo import RepoDrafter
from specdec.engine.drafters.repo_index import RepoIndex
from specdec.engine.drafters.union_tree import UnionTree, model_verdict
from specdec.engine.kv import KVModel
from specdec.engine.sampling import SamplingConfig
from specdec.engine.session import GenerationConfig, Session, greedy_reference
from specdec.engine.strategies import make_drafter, make_session, repo_drafters
from specdec.engine.tree import DETERMINISTIC, ROOT, TokenTree
from specdec.engine.tree_plan import TreePlanner
from specdec.engine.tree_shape import TreeShape

FLAT = CostCurve((1, 64), (1.0, 1.1))  # a big target on a GPU: wide trees cost little, and the tiny draft is cheap
GREEDY = SamplingConfig(temperature=0)


def head(tok) -> list[int]:
    """Every ordinary token once: a prompt that starts with it gives a 1-gram lookup a continuation on every step."""
    return list(range(8, len(tok)))

# repetitive code: prompt lookup finds 3-4 token repeats with several different continuations
TEXTS = ["self.x = x\nself.y = y\nself.z = z\nself.", "a = f(1)\nb = f(2)\nc = f(3)\nd = f(",
         "def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a"]


class FixedPlan(TreePlanner):
    """A planner that always plans `shape` (within the cap) but learns like the real one."""

    def __init__(self, shape: TreeShape):
        super().__init__(FLAT, max_nodes=len(shape))
        self.shape = shape

    def plan(self, cap: int) -> TreeShape:
        self.last = self.shape if cap >= len(self.shape) else TreeShape(self.shape.parents[:cap], self.shape.ranks[:cap])
        return self.last


def union_drafter(model, shape: TreeShape, repo_index=None, min_ngram: int = 2) -> UnionTree:
    repo = RepoDrafter(repo_index, min_match=2) if repo_index is not None else None
    return UnionTree(DraftTree(model), FixedPlan(shape), LookupTree(max_ngram=4, min_ngram=min_ngram), repo)


def test_one_tree_holds_every_sources_candidates_within_the_budget(unrelated_draft, tok):
    context = tok.encode(TEXTS[1])
    index = RepoIndex()
    index.add("/w/other.py", context[-6:] + tok.encode(" 42) + 1"))
    shape = TreeShape.chain(4)
    drafter = union_drafter(unrelated_draft, shape, index)
    draft = drafter.propose(context, 10, GREEDY)
    tree = draft.tree
    assert 0 < len(tree) <= len(shape) and draft.source == "tree"
    assert set(tree.drawn) == {DETERMINISTIC} and tree.child_probs is None
    assert draft.sources is not None and set(draft.sources) == {"draft-tree", "lookup-tree", "repo"}
    # each source's first nodes are there, and every node's path is one its source proposed
    alone = {"draft-tree": DraftTree(unrelated_draft).propose(context, 10, GREEDY, shape=shape).tree,
             "lookup-tree": LookupTree(max_ngram=4, min_ngram=2).propose_tree(context, len(shape)),
             "repo": RepoDrafter(index, min_match=2).propose_tree(context, len(shape), len(shape))}
    paths = {name: {tuple(t.tokens[i] for i in t.path(n)) for n in range(len(t))} for name, t in alone.items()}
    for node, source in enumerate(draft.sources):
        assert tuple(tree.tokens[i] for i in tree.path(node)) in paths[source]
    roots = {tree.tokens[c] for c in tree.children(ROOT)}
    assert all(t.tokens[0] in roots for t in alone.values())
    assert draft.credit([]) == {s: (draft.sources.count(s), 0) for s in set(draft.sources)}
    assert len(drafter.propose(context, 2, GREEDY).tree) <= 2  # the session's budget caps the plan


def test_an_empty_plan_is_a_plain_step(unrelated_draft, tok):
    drafter = union_drafter(unrelated_draft, TreeShape((), ()))
    assert drafter.propose(tok.encode(TEXTS[0]), 8, GREEDY).tokens == []


def test_the_models_verdict_is_its_part_of_the_accepted_branch():
    model = TokenTree([5, 6, 7], [ROOT, 0, ROOT])  # 5 6, and 7
    full = model_verdict(model, TreeVerdict([9, 4], [5, 6], 3, True))  # merged node ids differ
    assert (full.path, full.accepted_tokens, full.next_token, full.bonus) == ([0, 1], [5, 6], 3, True)
    short = model_verdict(model, TreeVerdict([0, 2, 3], [5, 8, 1], 2, False))  # 8 came from a lookup
    assert (short.path, short.accepted_tokens, short.next_token, short.bonus) == ([0], [5], 8, False)
    assert model_verdict(model, TreeVerdict([], [], 7, False)).path == []


def test_the_draft_cache_keeps_the_part_of_the_branch_it_drafted(target, tok):
    context = tok.encode(TEXTS[0])
    drafter = union_drafter(target, TreeShape((ROOT, 0, 1, ROOT), (0, 0, 0, 1)))
    session = Session(target, tok, drafter)
    verdicts = []
    observe = drafter.model.observe
    drafter.model.observe = lambda *a, **kw: verdicts.append(kw["verdict"]) or observe(*a, **kw)
    out = session.generate(context, GenerationConfig(12, GREEDY, max_draft=4))
    assert out.tokens == greedy_reference(target, context, 12, {tok.eos_token_id})
    assert verdicts and any(v.accepted for v in verdicts)
    # what the draft keeps is a prefix of what was generated: the next sync computes only the rest
    kept = drafter.model.kv.tokens
    assert kept[: len(context)] == context and (context + out.tokens)[: len(kept)] == kept


@pytest.mark.parametrize("with_index", [False, True])
def test_tree_strategy_equals_plain_greedy_and_credits_every_source(target, unrelated_draft, tok, with_index):
    """Without an index the draft is the target (its nodes are accepted) beside lookup nodes on every step;
    with one the draft is unrelated and the index holds the target's own continuation (its nodes are accepted)."""
    prompts = [head(tok) + tok.encode(text) for text in TEXTS]
    expected = [greedy_reference(target, prompt, 24, {tok.eos_token_id}) for prompt in prompts]
    index = None
    if with_index:
        index = RepoIndex()
        for i, (prompt, tokens) in enumerate(zip(prompts, expected)):
            index.add(f"/w/{i}.py", prompt + tokens)
    session = make_session(target, tok, "tree", unrelated_draft if with_index else target, cost_curve=FLAT,
                           repo_index=index, max_draft=8)
    assert isinstance(session.drafter, UnionTree) and session.drafter.planner.max_nodes == 8
    assert (repo_drafters(session.drafter) != []) == with_index
    session.drafter.lookup = LookupTree(max_ngram=4, min_ngram=1)  # the random target repeats no longer n-gram
    planner = session.drafter.planner
    observe = planner.observe  # FLAT stands for a GPU: this CPU's real pass times would recalibrate it away
    planner.observe = lambda *args, **kwargs: observe(*args, **{**kwargs, "pass_seconds": 0.0})
    drafted, accepted = {}, {}
    for prompt, tokens in zip(prompts, expected):
        out = session.generate(prompt, GenerationConfig(24, GREEDY, max_draft=8))
        assert out.tokens == tokens
        s = out.stats
        assert sum(s.drafted_by.values()) == s.drafted and sum(s.accepted_by.values()) == s.accepted
        assert all(s.accepted_by[k] <= s.drafted_by[k] and 0 < s.passes_by[k] <= s.drafted_by[k] for k in s.passes_by)
        assert max(s.passes_by.values()) <= s.target_passes - 1  # the prefill pass drafts nothing
        for k in s.drafted_by:
            drafted[k] = drafted.get(k, 0) + s.drafted_by[k]
            accepted[k] = accepted.get(k, 0) + s.accepted_by[k]
    assert set(drafted) == {"draft-tree", "lookup-tree"} | ({"repo"} if with_index else set())
    assert accepted["repo" if with_index else "draft-tree"] >= 24
    assert session.drafter.planner.draft_level_seconds is not None


def test_accepted_lookup_nodes_are_credited_to_the_lookup(unrelated_draft, tok):
    """The target follows the lookup's continuation: the accepted path is the lookup's, and so is its credit."""
    context = head(tok) + tok.encode(TEXTS[0])
    drafter = union_drafter(unrelated_draft, TreeShape.chain(6))
    draft = drafter.propose(context, 8, GREEDY)
    truth = as_chain(LookupTree(max_ngram=4, min_ngram=2).propose_tree(context, 6))
    assert truth and truth[0] not in [draft.tree.tokens[c] for c in DraftTree(unrelated_draft).propose(
        context, 8, GREEDY, shape=TreeShape.chain(6)).tree.children(ROOT)]
    rows = torch.zeros(len(draft.tree) + 1, len(tok))
    for position in range(len(draft.tree) + 1):  # the target's argmax: the lookup's chain, then a token of its own
        path = [] if position == 0 else [draft.tree.tokens[i] for i in draft.tree.path(position - 1)]
        rows[position, truth[len(path)] if path == truth[: len(path)] and len(path) < len(truth) else 3] = 1.0
    verdict = verify_tree(draft.tree, rows, GREEDY)
    assert verdict.accepted_tokens == truth[: verdict.accepted] and verdict.accepted >= 2
    assert all(draft.sources[i] == "lookup-tree" for i in verdict.path)
    assert draft.credit(verdict.path)["lookup-tree"][1] == verdict.accepted
    assert draft.credit(verdict.path)["draft-tree"][1] == 0


class ThirdChoice:
    """A lookup stand-in whose candidates the target sometimes takes (a random target never repeats the prompt):
    the target's third most likely token after the context, then its best one after that. A function of the
    context alone, never of the target's draws, like a real lookup."""

    name = "lookup-tree"

    def __init__(self, target):
        self.target, self.seen = target, {}

    def propose_tree(self, context: list[int], max_nodes: int) -> TokenTree:
        key = tuple(context)
        if key not in self.seen:
            third = int(KVModel(self.target).extend(context)[-1].topk(3).indices[2])
            after = int(KVModel(self.target).extend(context + [third])[-1].argmax())
            self.seen[key] = TokenTree([third, after], [ROOT, 0])
        return self.seen[key]


def test_sampling_with_the_union_follows_the_target(target, tok):
    """The first three tokens against the target's exact law (top_k=3), drafted by merged trees whose root
    holds the draft model's best token beside a lookup's: deterministic candidates of two sources at one
    position, each accepted now and then."""
    config = lambda seed: SamplingConfig(temperature=1.0, top_k=3, seed=seed)

    prompt = tok.encode(TEXTS[0])
    law = three_token_law(target, prompt, config(0))
    drafter = union_drafter(target, TreeShape((ROOT, 0, ROOT, 2), (0, 0, 1, 0)))
    drafter.lookup = ThirdChoice(target)
    session = Session(target, tok, drafter, stop_on_eos=False)  # no stop ids: every run yields three tokens
    merged, lookup_accepted = [], []

    def run(seed):
        calls = []
        stop = lambda text: calls.append(text) or (len(text) if len(calls) == 3 else None)
        out = session.generate(prompt, GenerationConfig(8, config(seed), max_draft=4), stop=stop)
        assert out.stop_reason == "stop" and len(out.tokens) == 3
        merged.append("lookup-tree" in out.stats.drafted_by)
        lookup_accepted.append(out.stats.accepted_by.get("lookup-tree", 0))
        return tuple(out.tokens)

    n = 400
    counts = dict.fromkeys(law, 0)
    for seed in range(n):
        tokens = run(seed)
        assert tokens in law, tokens  # nothing the target's top-3 excludes
        counts[tokens] += 1
    assert all(merged) and sum(lookup_accepted) > n // 20, sum(lookup_accepted)  # and some were taken
    assert pooled_pvalue(counts, law, n) > 0.001


def test_auto_without_a_draft_model_needs_no_curve_and_is_unchanged():
    from specdec.engine.drafters.prompt_lookup import PromptLookup
    from specdec.engine.strategies import needs_cost_curve

    assert needs_cost_curve("auto") and not needs_cost_curve("auto", draft_model=False)
    assert needs_cost_curve("tree", draft_model=False) and not needs_cost_curve("lookup")
    assert isinstance(make_drafter("auto", cost_curve=FLAT), PromptLookup)
