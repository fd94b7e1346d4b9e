"""The `tree` strategy's drafter: one tree per step from every source that has something to offer.

The draft model fills the shape Sequoia plans (DraftTree); prompt lookup offers the distinct
continuations of the context's last n-gram (lookup_tree.py); the repository index, when there
is one, the distinct continuations of the text before the cursor across the workspace
(RepoDrafter.propose_tree). One target pass then picks whichever source is right: the trees
are merged as a trie (tree_merge.union_origins), so agreement costs one node and disagreement
becomes siblings, and the merge is cut to the planner's node budget taking each source's best
nodes in turn.

Exact at any temperature: a merged position holds candidates from several sources, so its
children are deterministic (acceptance.py: accept child x with probability p(x), else zero
p(x), renormalise, try the next), and no candidate depends on the target's draws. The planner
learns from the merged trees' verdicts, so it sizes the tree by what the union of sources gets
accepted, and the draft model's cache keeps whatever part of the accepted branch it drafted.
Each node's source goes into the Draft, so the per-source statistics credit every source its own.
"""

from __future__ import annotations

import torch

from specdec.engine.acceptance import TreeVerdict
from specdec.engine.drafters.base import Draft
from specdec.engine.drafters.draft_tree import DraftTree
from specdec.engine.drafters.lookup_tree import LookupTree
from specdec.engine.drafters.repo import RepoDrafter
from specdec.engine.sampling import SamplingConfig
from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_merge import union_origins
from specdec.engine.tree_plan import TreePlanner


class UnionTree:
    """model: the draft model's tree drafter (its own planner unused: this one plans for the union);
    lookup / repo: the free sources (None: left out). The planner's plan is the node budget: an
    empty plan is a plain step, as for the draft model alone."""

    name = "tree"

    def __init__(self, model: DraftTree, planner: TreePlanner, lookup: LookupTree | None = None,
                 repo: RepoDrafter | None = None):
        self.model, self.planner, self.lookup, self.repo = model, planner, lookup, repo
        self.model.planner = None
        self.length = model.length  # Drafter protocol: the draft model's running acceptance and cost
        self._pending: tuple[Draft, TokenTree] | None = None  # the model's draft and the merged tree

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None = None, request=None) -> Draft:
        """At most min(k, the plan's size) nodes. No randomness is drawn (every source is deterministic).
        request: the request's context, for the repository drafter."""
        self._pending = None
        shape = self.planner.plan(k)
        budget = len(shape)
        if budget <= 0:
            return Draft([], None, self.name, plan=shape)
        model = self.model.propose(context, k, sampling, shape=shape)
        trees, names = [model.as_tree()], [self.model.name]
        if self.lookup is not None:
            trees.append(self.lookup.propose_tree(context, budget))
            names.append(self.lookup.name)
        if self.repo is not None:
            found = self.repo.propose_tree(context, budget, budget, request)
            if found is not None:
                trees.append(found)
                names.append(self.repo.name)
        merged, origins = union_origins(trees, budget)
        if not len(merged):
            return Draft([], None, self.name, plan=shape)
        self._pending = (model, merged)
        return Draft.of_tree(merged, self.name, [names[o] for o in origins], plan=shape)

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float,
                verdict: TreeVerdict | None = None) -> None:
        """The planner learns the merged tree's verdict (timed per draft-model level); the draft
        model learns, and keeps in its cache, the part of the accepted branch it drafted."""
        pending, self._pending = self._pending, None
        tree = draft.as_tree()
        model = pending[0] if pending is not None and pending[1] is draft.tree else None
        if verdict is not None:
            self.planner.observe(tree, verdict, self.model.level_timing() if model is not None else 0.0, 1,
                                 pass_seconds=target_pass_seconds)
        if model is None:  # not the tree proposed last: the draft's next sync drops its unverified tree
            return
        mine = model_verdict(model.as_tree(), verdict) if verdict is not None else None
        self.model.observe(model, mine.accepted if mine else 0, draft_seconds, target_pass_seconds, verdict=mine)

    def prefill(self, context: list[int], should_stop=None) -> tuple[int, int]:
        return self.model.prefill(context, should_stop)

    def reset(self) -> None:
        self.model.reset()
        self._pending = None

    def members(self) -> tuple:
        """The sources (strategies.repo_drafters finds the repository drafter here)."""
        return tuple(m for m in (self.model, self.lookup, self.repo) if m is not None)


def model_verdict(tree: TokenTree, verdict: TreeVerdict) -> TreeVerdict:
    """The merged verdict seen from one source's tree: its nodes along the accepted tokens, as far
    as it drafted them; where it stops short, the next token is the accepted one it lacked."""
    path, node = [], ROOT
    for token in verdict.accepted_tokens:
        child = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
        if child is None:
            break
        path.append(child)
        node = child
    tokens = verdict.accepted_tokens[: len(path)]
    following = verdict.next_token if len(path) == verdict.accepted else verdict.accepted_tokens[len(path)]
    return TreeVerdict(path, tokens, following, not tree.children(node))
