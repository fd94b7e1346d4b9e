"""Tree drafts through the session: greedy output is plain greedy whatever the tree, sampling
follows the target's law; the draft model's tree drafter grows the tree it says it grows and
keeps its cache in step with what the target accepted."""

import random

import pytest
import torch
from sequence_law import pooled_pvalue, three_token_law

from specdec.engine.acceptance import TreeVerdict
from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft
from specdec.engine.drafters.composite import Composite
from specdec.engine.drafters.draft_tree import DraftTree, TreeLimits
from specdec.engine.drafters.prompt_lookup import PromptLookup
from specdec.engine.kv import KVModel
from specdec.engine.sampling import SamplingConfig, probabilities
from specdec.engine.session import GenerationConfig, Session, greedy_reference
from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_shape import TreeShape
from specdec.errors import SpecdecError

MAX_NEW = 20
TEXTS = ["def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n  "]
ATOL = 1e-4  # fp32 logits of magnitude ~10 (see test_tree_pass.py)


@pytest.fixture(scope="module")
def reference(target, tok):
    cache = {}

    def ref(prompt):
        if tuple(prompt) not in cache:
            cache[tuple(prompt)] = greedy_reference(target, prompt, MAX_NEW, {tok.eos_token_id})
        return cache[tuple(prompt)]

    return ref


class RandomTrees:
    """Random trees around the known greedy continuation: its first `keep` tokens are a path of
    the tree, at random sibling ranks among random decoys (keep = 0: the path is absent)."""

    name = "random-tree"

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.length = DraftLength()
        self.prompt: list[int] = []
        self.truth: list[int] = []
        self.verdicts: list[tuple[TokenTree, list[int], TreeVerdict]] = []

    def expect(self, prompt: list[int], greedy: list[int]) -> None:
        self.prompt, self.truth = prompt, greedy

    def propose(self, context, k, sampling, generator=None, request=None) -> Draft:
        truth = self.truth[len(context) - len(self.prompt):]
        n = self.rng.randint(1, k)
        keep = self.rng.randint(0, min(n, len(truth)))
        tokens, parents, path = [], [], []
        for i in range(n):
            if len(path) < keep and (self.rng.random() < 0.4 or n - i == keep - len(path)):
                parents.append(path[-1] if path else ROOT)
                tokens.append(truth[len(path)])
                path.append(i)
            else:
                parents.append(self.rng.randint(ROOT, i - 1))
                tokens.append(self.rng.randrange(8, 360))
        self.last_truth = truth
        return Draft.of_tree(TokenTree(tokens, parents), self.name)

    def observe(self, draft, accepted, draft_seconds, target_pass_seconds, verdict=None) -> None:
        self.verdicts.append((draft.tree, self.last_truth, verdict))

    def prefill(self, context, should_stop=None):
        return 0, 0

    def reset(self) -> None:
        pass


@pytest.mark.parametrize("seed", range(4))
def test_random_trees_give_plain_greedy(target, tok, reference, seed):
    drafter = RandomTrees(seed)
    session = Session(target, tok, drafter)
    for text in TEXTS + TEXTS[:1]:  # the last one reuses the first one's cache
        prompt = tok.encode(text)
        drafter.expect(prompt, reference(prompt))
        before = len(drafter.verdicts)
        out = session.generate(prompt, GenerationConfig(MAX_NEW, max_draft=1 + 4 * seed))
        assert out.tokens == reference(prompt), (seed, text)
        trees = [tree for tree, _, _ in drafter.verdicts[before:]]
        assert out.stats.drafted == sum(len(t) for t in trees) and out.stats.drafted_depth == sum(t.depth for t in trees)
        assert out.stats.tree_passes == sum(len(t) > t.depth for t in trees)
    for _, truth, v in drafter.verdicts:  # tree drafts get the verdict: the greedy path, then its next token
        assert v.accepted_tokens + [v.next_token] == truth[: v.accepted + 1] or len(truth) <= v.accepted
    if seed:
        assert sum(len(t) > t.depth for t, _, _ in drafter.verdicts) > 0  # some trees branched
        assert sum(v.accepted for _, _, v in drafter.verdicts) > 0  # and some paths were taken


PLANNED = TreeShape((ROOT, ROOT, ROOT, 0, 0, 1, 3, 5, 7), (0, 1, 2, 0, 1, 0, 0, 0, 0))  # wide on top, then deep
PLANS = [TreeLimits(budget=1, depth=1, branch=1, width=1), TreeLimits(budget=6, depth=3, branch=2, width=2),
         TreeLimits(budget=12, depth=6, branch=3, width=2), TreeLimits(budget=10, depth=2, branch=8, width=4), PLANNED]


def plan_id(plan) -> str:
    if isinstance(plan, TreeShape):
        return f"planned{len(plan)}"
    return f"b{plan.budget}d{plan.depth}k{plan.branch}w{plan.width}"


@pytest.mark.parametrize("plan", PLANS, ids=plan_id)
@pytest.mark.parametrize("draft", ["same", "unrelated"])
def test_draft_tree_gives_plain_greedy(target, unrelated_draft, tok, reference, plan, draft):
    model = target if draft == "same" else unrelated_draft
    drafter = DraftTree(model, shape=plan) if isinstance(plan, TreeShape) else DraftTree(model, plan)
    session = Session(target, tok, drafter)
    computed = []
    sync = drafter.kv.sync

    def counted(context, should_stop=None):
        result = sync(context, should_stop)
        computed.append(result[2])
        return result

    drafter.kv.sync = counted
    for text in TEXTS:
        prompt = tok.encode(text)
        computed.clear()
        out = session.generate(prompt, GenerationConfig(MAX_NEW, max_draft=12))
        assert out.tokens == reference(prompt), text
        assert out.stats.drafted <= 12 * (out.stats.target_passes - 1)
        # after the prefill the draft computes only what the accepted branch did not leave in its cache:
        # the next token, and a last-level leaf it never ran
        assert max(computed[1:], default=0) <= 2, computed
    if draft == "same":
        assert out.stats.accepted > 0
        if plan_id(plan) != "b1d1k1w1":  # every other plan branches
            assert out.stats.tree_passes > 0 and out.stats.drafted > out.stats.drafted_depth


def test_draft_tree_is_the_best_budget_nodes_of_its_expansion(target, tok):
    """branch 2, width 4, depth 3 expands every node: the 14-node full binary tree, of which the
    6 most probable (cumulative draft probability, by plain linear passes) must be kept."""
    drafter = DraftTree(target, TreeLimits(budget=6, depth=3, branch=2, width=4))
    context = tok.encode("def add(a, b):\n    return")
    draft = drafter.propose(context, 32, SamplingConfig())
    tree = draft.tree
    assert len(tree) == 6 and draft.tokens == tree.tokens and tree.drawn == ["deterministic"] * 7

    def belief(path):
        return KVModel(target).extend(context + path)[-1].softmax(-1)

    full = {(): 1.0}  # path -> cumulative probability, the full binary tree by brute force
    for depth in range(3):
        for path, score in [(p, s) for p, s in full.items() if len(p) == depth]:
            top = torch.topk(belief(list(path)), 2)
            for prob, token in zip(top.values.tolist(), top.indices.tolist()):
                full[path + (token,)] = score * prob
    del full[()]
    best = sorted(full.values(), reverse=True)[:6]
    kept = [full[tuple(tree.tokens[i] for i in tree.path(node))] for node in range(len(tree))]
    assert sorted(kept, reverse=True) == pytest.approx(best, rel=1e-4)
    for node in [ROOT, *range(len(tree))]:  # children are top-k, in rank order
        children = [tree.tokens[c] for c in tree.children(node)]
        path = [] if node == ROOT else [tree.tokens[i] for i in tree.path(node)]
        assert children == torch.topk(belief(path), 2).indices.tolist()[: len(children)]


def test_draft_tree_respects_its_limits_and_k(unrelated_draft, tok):
    drafter = DraftTree(unrelated_draft, TreeLimits(budget=12, depth=4, branch=3, width=2))
    context = tok.encode("import os\nimport")
    sampling = SamplingConfig(temperature=0.9, top_k=20)
    tree = drafter.propose(context, 32, sampling).tree
    assert len(tree) == 12 and tree.depth <= 4
    assert all(len(tree.children(n)) <= 3 for n in [ROOT, *range(len(tree))])
    assert len(drafter.propose(context, 5, sampling).tree) == 5  # the session's k caps the nodes
    small = TreeLimits(budget=3, depth=1, branch=3, width=1)
    tree = drafter.propose(context, 32, sampling, limits=small).tree  # per-call limits win
    assert tree.parents == [ROOT] * 3
    drafter.limits = TreeLimits(budget=2, depth=2, branch=1, width=1)  # so do new defaults
    assert drafter.propose(context, 32, sampling).tree.parents == [ROOT, 0]
    assert drafter.propose(context, 0, sampling).tokens == []
    with pytest.raises(SpecdecError, match="branch"):
        TreeLimits(branch=0)


def test_draft_tree_fills_a_planned_shape(target, tok):
    """Sequoia's planner gives the topology and each node's rank: node i is the ranks[i]-th best
    draft token after its parent (checked by linear passes); k keeps the first k nodes."""
    drafter = DraftTree(target)
    context = tok.encode("for i in range(10):\n  ")
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.7, top_k=50)):
        tree = drafter.propose(context, 32, sampling, shape=PLANNED).tree
        assert TreeShape.of(tree) == PLANNED
        for node in range(len(tree)):
            before = [tree.tokens[i] for i in tree.path(tree.parents[node])] if tree.parents[node] != ROOT else []
            logits = KVModel(target).extend(context + before)[-1]
            belief = logits.softmax(-1) if sampling.greedy else probabilities(logits, sampling)
            assert tree.tokens[node] == torch.topk(belief, PLANNED.ranks[node] + 1).indices[-1], node
    assert TreeShape.of(drafter.propose(context, 5, SamplingConfig(), shape=PLANNED).tree) == TreeShape(
        PLANNED.parents[:5], PLANNED.ranks[:5])
    drafter.shape = TreeShape((ROOT, 0), (0, 0))  # a planner's standing shape, used when none is passed
    assert drafter.propose(context, 32, SamplingConfig()).tree.parents == [ROOT, 0]
    drafter.shape = TreeShape((), ())  # the planner's "do not draft"
    assert drafter.propose(context, 32, SamplingConfig()).tokens == []


def test_observe_keeps_the_accepted_branch_in_the_draft_cache(unrelated_draft, tok):
    drafter = DraftTree(unrelated_draft, TreeLimits(budget=10, depth=4, branch=2, width=2))
    context = tok.encode("class Point:\n    def")
    drafter.prefill(context)
    nodes = len(drafter.propose(context, 32, SamplingConfig()).tree)
    for node in range(nodes):
        draft = drafter.propose(context, 32, SamplingConfig())
        tree = draft.tree
        path = tree.path(node)
        verdict = TreeVerdict(path, [tree.tokens[i] for i in path], 99, not tree.children(node))
        drafter.observe(draft, len(path), 0.01, 0.02, verdict=verdict)
        kv = drafter.kv
        cached = kv.tokens[len(context):]
        assert kv.tree_tokens == [] and kv.cache.get_seq_length() == len(kv.tokens)
        assert kv.tokens[: len(context)] == context and cached == verdict.accepted_tokens[: len(cached)]
        assert len(cached) >= len(path) - 1  # only a last-level node may be missing
        following = context + verdict.accepted_tokens + [99]
        logits, reused, computed = kv.sync(following)
        assert reused == len(context) + len(cached) and computed == len(following) - reused
        torch.testing.assert_close(logits, KVModel(unrelated_draft).extend(following)[-1], rtol=0, atol=ATOL)
        kv.sync(context)
    draft = drafter.propose(context, 32, SamplingConfig())
    drafter.observe(draft, 0, 0.0, 0.0)  # no verdict: nothing to keep by, the tree is dropped
    assert drafter.kv.tokens == context and drafter.kv.tree_tokens == []


def test_composite_hands_the_tree_drafter_its_verdict(target, tok, reference):
    tree = DraftTree(target, TreeLimits(budget=6, depth=3, branch=2, width=2))
    seen = []
    observe = tree.observe
    tree.observe = lambda *args, **kw: seen.append(kw.get("verdict")) or observe(*args, **kw)
    session = Session(target, tok, Composite(PromptLookup(length=DraftLength(k_max=4)), tree))
    prompt = tok.encode(TEXTS[0])
    assert session.generate(prompt, GenerationConfig(MAX_NEW, max_draft=6)).tokens == reference(prompt)
    assert seen and all(isinstance(v, TreeVerdict) for v in seen)


def test_sampling_with_a_tree_follows_the_target(target, tok):
    """The first three tokens against the target's exact law (top_k=3: 27 cells). The second
    one comes from a tree pass, the third from a tree node's row or the next pass, so the rows
    of siblings and their children count; the draft is the target, so acceptances, rejected
    siblings and recoveries all happen. Seeded: a seed's output is reproducible."""
    config = lambda seed: SamplingConfig(temperature=1.0, top_k=3, seed=seed)
    prompt = tok.encode("def add(a, b):\n    return")

    law = three_token_law(target, prompt, config(0))
    # no stop ids, EOS included: every run yields three tokens
    session = Session(target, tok, DraftTree(target, TreeLimits(budget=4, depth=2, branch=2, width=2)),
                      stop_on_eos=False)

    def run(seed):
        calls = []
        stop = lambda text: calls.append(text) or (len(text) if len(calls) == 3 else None)
        out = session.generate(prompt, GenerationConfig(8, config(seed), max_draft=4), stop=stop)
        assert out.stop_reason == "stop" and len(out.tokens) == 3 and out.stats.drafted >= 4
        return tuple(out.tokens)

    counts = dict.fromkeys(law, 0)
    for seed in range(400):
        tokens = run(seed)
        assert tokens in law, tokens  # nothing the target's top-3 excludes
        counts[tokens] += 1
    assert run(7) == run(7)
    assert pooled_pvalue(counts, law, 400) > 0.001


def test_a_draft_that_first_caught_up_on_plain_steps_is_timed_by_its_levels_alone(unrelated_draft, tok):
    """After plain steps, the draft's sync runs every token the target produced alone; counted as a
    level, that made drafting look many times dearer than it is, and the planner never drafted again."""
    drafter = DraftTree(unrelated_draft)
    context = tok.encode("class Point:\n    def")
    drafter.prefill(context)
    drafter.propose(context, 8, SamplingConfig(), shape=TreeShape.chain(3))
    assert drafter.catch_up <= 2
    sync, levels, passes = drafter._timed
    assert passes == 2 and drafter.level_timing() == pytest.approx((sync + levels) / 3)

    context = context + tok.encode(" move(self, dx, dy):\n        self.x += dx")  # the target's, undrafted
    drafter.propose(context, 8, SamplingConfig(), shape=TreeShape.chain(3))
    assert drafter.catch_up > 2
    sync, levels, passes = drafter._timed
    assert drafter.level_timing() == pytest.approx(levels / 2)  # the catch-up is not a level
    drafter.propose(context + [5], 8, SamplingConfig(), shape=TreeShape.chain(1))
    assert drafter.level_timing() > 0  # steady again: the sync is the one level
