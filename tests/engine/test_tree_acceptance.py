"""The tree acceptance rule outputs exactly the target distribution (chi-square tests),
each test paired with a deliberately wrong rule it must reject; greedy trees equal plain
greedy; a chain verified as a tree gets the chain rule's verdict."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import specdec.engine.acceptance as acceptance
from specdec.engine.acceptance import verify, verify_tree, verify_tree_probabilities
from specdec.engine.sampling import SamplingConfig
from specdec.engine.tree import DETERMINISTIC, DRAWN, ROOT, WITH_REPLACEMENT, WITHOUT_REPLACEMENT, TokenTree

V = 6  # vocabulary
N = 5000  # trials per chi-square test
BRANCHING = (3, 2)  # the root gets 3 children, each of them 2: a depth-2 tree of 9 nodes
ALPHA = 0.01


def _dirichlet(gen: torch.Generator, *shape: int) -> torch.Tensor:
    x = -torch.log(torch.rand(*shape, V, generator=gen))  # Exp(1) normalised = Dirichlet(1)
    return x / x.sum(-1, keepdim=True)


def _laws(seed: int = 0):
    """Target p and draft q for the root and after each first token, with zeros on both sides."""
    gen = torch.Generator().manual_seed(seed)
    p_root, q_root = _dirichlet(gen), _dirichlet(gen)
    p_root[5] = 0  # the target never emits 5 (top-k/top-p cut) while q proposes it
    q_root[0] = 0  # q never proposes 0 while the target wants it
    p_root, q_root = p_root / p_root.sum(), q_root / q_root.sum()
    p_after, q_after = _dirichlet(gen, V), _dirichlet(gen, V)  # [V, V]: row a = law after token a
    p_after[:, 4] = 0
    p_after = p_after / p_after.sum(-1, keepdim=True)
    p_deeper = _dirichlet(gen, V, V)  # [V, V, V]: law after (a, b), only feeds bonus tokens
    return p_root, q_root, p_after, q_after, p_deeper


def _draw_children(q: torch.Tensor, m: int, drawn: str, gen: torch.Generator) -> list[int]:
    if drawn == DETERMINISTIC:
        return torch.topk(q, m).indices.tolist()
    if drawn == WITH_REPLACEMENT:
        return torch.multinomial(q, m, replacement=True, generator=gen).tolist()
    out, q = [], q.clone()
    for _ in range(m):  # without replacement: each draw from q with the earlier ones removed
        x = int(torch.multinomial(q, 1, generator=gen))
        out.append(x)
        q[x] = 0
    return out


def draft_tree(laws, drawn: str, gen: torch.Generator) -> tuple[TokenTree, torch.Tensor]:
    """A depth-2 tree drawn from q the stated way, and its target rows (one per position)."""
    p_root, q_root, p_after, q_after, p_deeper = laws
    tokens, parents, q_rows, p_rows = [], [], [q_root], [p_root]
    for a in _draw_children(q_root, BRANCHING[0], drawn, gen):
        tokens.append(a)
        parents.append(ROOT)
        q_rows.append(q_after[a])
        p_rows.append(p_after[a])
        first = len(tokens) - 1
        for b in _draw_children(q_after[a], BRANCHING[1], drawn, gen):
            tokens.append(b)
            parents.append(first)
            q_rows.append(torch.zeros(V))  # leaves: unused
            p_rows.append(p_deeper[a, b])
    # parents precede children but siblings' subtrees interleave; fine for a TokenTree
    return TokenTree(tokens, parents, torch.stack(q_rows), drawn), torch.stack(p_rows)


def emitted_pairs(drawn: str, n: int = N, seed: int = 0) -> torch.Tensor:
    """[V, V] counts of the first two tokens of the stream from draft_tree's trees."""
    return stream_pairs(lambda laws, gen: draft_tree(laws, drawn, gen), n, seed)


def stream_pairs(make_tree, n: int, seed: int) -> torch.Tensor:
    """[V, V] counts of the first two tokens of the stream, verifying make_tree(laws, gen)'s (tree,
    target probabilities) n times; when a verdict yields one token the second is drawn from the
    target, as the next round would."""
    laws = _laws()
    p_after = laws[2]
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(n):
        tree, target_probs = make_tree(laws, gen)
        v = verify_tree_probabilities(tree, target_probs, gen)
        stream = v.accepted_tokens + [v.next_token]
        if len(stream) < 2:
            stream.append(int(torch.multinomial(p_after[stream[0]], 1, generator=gen)))
        counts[stream[0], stream[1]] += 1
    return counts


def _pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square p-value of counts against law; cells expecting < 5 are pooled."""
    counts, law = counts.flatten(), law.flatten()
    assert counts[law == 0].sum() == 0, "emitted something the target gives probability 0"
    expected = law * counts.sum()
    big = expected >= 5
    observed = counts[big].tolist() + [counts[~big].sum().item()]
    wanted = expected[big].tolist() + [expected[~big].sum().item()]
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    wanted[-1] += sum(observed) - sum(wanted)  # float rounding: totals must agree exactly
    return float(chisquare(observed, wanted).pvalue)


def pvalues(counts: torch.Tensor) -> tuple[float, float]:
    """(first token, first two tokens jointly) against the target's p."""
    p_root, _, p_after, _, _ = _laws()
    return _pvalue(counts.sum(1), p_root), _pvalue(counts, p_root[:, None] * p_after)


@pytest.mark.parametrize("drawn", DRAWN)
def test_tree_output_follows_p(drawn):
    first, joint = pvalues(emitted_pairs(drawn))
    assert first > ALPHA and joint > ALPHA, (first, joint)


def _skip_residual(p, q, x, drawn):
    return p, q  # wrong: retries the next child and recovers from the unchanged p


def _keep_q(p, q, x, drawn):
    residual = (p - q).clamp_min(0)
    return residual / residual.sum(), q  # wrong without replacement: q(x) stays


WRONG = {
    WITH_REPLACEMENT: _skip_residual,  # residual renormalisation skipped
    WITHOUT_REPLACEMENT: _keep_q,  # q not zeroed at the rejected child
    DETERMINISTIC: _skip_residual,  # p(x) not zeroed at the rejected child
}


@pytest.mark.parametrize("drawn", DRAWN)
def test_wrong_rule_fails_the_same_test(drawn, monkeypatch):
    """Negative control: the chi-square test has the power to see each rule's key step."""
    monkeypatch.setattr(acceptance, "_reject", WRONG[drawn])
    first, joint = pvalues(emitted_pairs(drawn))
    assert min(first, joint) < 1e-4, (first, joint)



def exact_law(p: torch.Tensor, q: torch.Tensor, draws: torch.Tensor, m: int, drawn: str, reject) -> torch.Tensor:
    """The exact law of the token a position emits when m children are drawn from `draws` as
    stated (deterministic: its top-m, in order) and the rule, believing q, runs `reject`."""
    if m == 0:
        return p  # every child rejected: the recovered token follows the residual
    out = torch.zeros_like(p)
    if drawn == DETERMINISTIC:
        x = int(draws.argmax())
        rest = draws.clone()
        rest[x] = -1
        out[x] += p[x]
        return out + (1 - p[x]) * exact_law(reject(p, None, x, drawn)[0], q, rest, m - 1, drawn, reject)
    for x in torch.nonzero(draws).flatten().tolist():
        accept = torch.clamp(p[x] / q[x], max=1.0) if q[x] > 0 else torch.ones((), dtype=p.dtype)
        out[x] += draws[x] * accept
        rest = draws
        if drawn == WITHOUT_REPLACEMENT:  # the next sibling really is drawn without x
            rest = draws.clone()
            rest[x] = 0
            rest = rest / rest.sum()
        out += draws[x] * (1 - accept) * exact_law(*reject(p, q, x, drawn), rest, m - 1, drawn, reject)
    return out


@pytest.mark.parametrize("drawn", DRAWN)
def test_exact_law_of_each_position_is_p(drawn):
    """No sampling error: enumerating every draw, a position with 1..4 children emits exactly p,
    and the wrong rule of the negative control does not."""
    p_root, q_root, p_after, q_after, _ = (x.double() / x.double().sum(-1, keepdim=True) for x in _laws())
    pairs = [(p_root, q_root)] + [(p_after[a], q_after[a]) for a in range(V)]
    for m in range(1, 5):
        for p, q in pairs:
            assert torch.allclose(exact_law(p, q, q, m, drawn, acceptance._reject), p, rtol=0, atol=1e-12)
    worst = max((exact_law(p, q, q, 3, drawn, WRONG[drawn]) - p).abs().max().item() for p, q in pairs)
    assert worst > 0.05, worst

# ---- greedy: the tree's output is plain greedy decoding -------------------------------------


def _oracle(base: int):
    """A target that is a function of the prefix, as a real model's logits are (fp32)."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in cache:
            cache[prefix] = torch.randn(V, generator=torch.Generator().manual_seed(hash((base, *prefix)) % 2**62))
        return cache[prefix]
    return logits


def _prefix(tree: TokenTree, node: int) -> tuple[int, ...]:
    return tuple(tree.tokens[i] for i in tree.path(node))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_greedy_tree_equals_plain_greedy(data):
    logits = _oracle(data.draw(st.integers(0, 10**6)))
    n = data.draw(st.integers(0, 12))
    tokens, parents = [], []
    for i in range(n):
        parent = data.draw(st.integers(ROOT, i - 1))
        prefix = () if parent == ROOT else tuple(tokens[j] for j in _path(parents, parent))
        follow = data.draw(st.booleans())  # often the argmax, so paths get long
        tokens.append(int(logits(prefix).argmax()) if follow else data.draw(st.integers(0, V - 1)))
        parents.append(parent)
    drawn = data.draw(st.sampled_from(DRAWN))  # greedy ignores the source
    probs = None if drawn == DETERMINISTIC else torch.softmax(torch.randn(n + 1, V), -1)
    tree = TokenTree(tokens, parents, probs, drawn)
    rows = torch.stack([logits(())] + [logits(_prefix(tree, i)) for i in range(n)])
    v = verify_tree(tree, rows, SamplingConfig())

    plain, prefix = [], ()
    for _ in range(v.accepted + 1):
        plain.append(int(logits(prefix).argmax()))
        prefix += (plain[-1],)
    assert v.accepted_tokens + [v.next_token] == plain
    matching = [i for i in range(n) if all(tree.tokens[j] == int(rows[tree.parents[j] + 1].argmax())
                                           for j in tree.path(i))]
    assert v.accepted == max((tree.depths[i] for i in matching), default=0)
    if v.path:
        assert tree.path(v.path[-1]) == v.path
    assert v.bonus == (not tree.children(v.path[-1] if v.path else ROOT))


def _path(parents: list[int], node: int) -> list[int]:
    out = []
    while node != ROOT:
        out.append(node)
        node = parents[node]
    return out[::-1]


# ---- the chain is the one-branch tree ------------------------------------------------------

CONFIGS = [SamplingConfig(), SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=4),
           SamplingConfig(temperature=1.3, top_p=0.8)]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(0, 5), config=st.sampled_from(CONFIGS),
       with_q=st.booleans())
def test_chain_tree_gets_the_chain_verdict(seed, k, config, with_q):
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(k + 1, V, generator=gen)
    if with_q:  # q close to p half the time, so long acceptances happen
        q = torch.softmax(logits[:k] + torch.randn(k, V, generator=gen), -1)
        tokens = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
    else:
        q = None
        tokens = [int(logits[i].argmax()) if torch.rand(1, generator=gen) < 0.6 else
                  int(torch.randint(V, (1,), generator=gen)) for i in range(k)]
    chain = verify(tokens, q, logits, config, torch.Generator().manual_seed(seed))
    tree = verify_tree(TokenTree.chain(tokens, q), logits, config, torch.Generator().manual_seed(seed))
    assert tree.verdict() == chain
    assert tree.path == list(range(chain.accepted)) and tree.accepted_tokens == tokens[:chain.accepted]
    assert tree.bonus == (chain.accepted == k)


# ---- the data type --------------------------------------------------------------------------


def test_token_tree_structure():
    tree = TokenTree([7, 8, 9, 10], [-1, -1, 0, 2])
    assert tree.depths == [1, 1, 2, 3]
    assert tree.children(ROOT) == [0, 1] and tree.children(0) == [2] and tree.children(3) == []
    assert tree.path(3) == [0, 2, 3] and tree.path(ROOT) == []
    assert tree.depth == 3 and TokenTree([], []).depth == 0
    assert [tree.rank(i) for i in range(4)] == [0, 1, 0, 0]  # 1 is the root's second child
    assert tree.drawn == [DETERMINISTIC] * 5
    chain = TokenTree.chain([4, 5, 6], torch.full((3, V), 1 / V))
    assert chain.parents == [-1, 0, 1] and chain.depths == [1, 2, 3]
    assert chain.child_probs.shape == (4, V) and chain.drawn[0] == WITH_REPLACEMENT
    assert TokenTree.chain([], None).children(ROOT) == []


@pytest.mark.parametrize("tokens, parents, probs, drawn", [
    ([1, 2], [-1, 1], None, DETERMINISTIC),  # parent after child
    ([1, 2], [-1, -2], None, DETERMINISTIC),  # no such parent
    ([1, 2], [-1], None, DETERMINISTIC),  # a parent missing
    ([1, 2], [-1, 0], None, WITH_REPLACEMENT),  # sampled children need their q
    ([1, 2], [-1, 0], torch.ones(2, V), WITH_REPLACEMENT),  # q needs n + 1 rows
    ([1, 2], [-1, 0], None, "nucleus"),  # unknown way of drawing
])
def test_token_tree_validation(tokens, parents, probs, drawn):
    with pytest.raises(ValueError):
        TokenTree(tokens, parents, probs, drawn)


LOOKUP = (0, 1)  # a lookup's continuation: token 0 (which q never proposes) then 1


def merged_tree(laws, gen: torch.Generator, keep_q: bool = False) -> tuple[TokenTree, torch.Tensor]:
    """A sampled draft (the root's 2 children and one child each, drawn from q with replacement) merged with
    the lookup's chain as tree_merge.union merges them: one trie, every position deterministic. keep_q: the
    wrong merge, which keeps the draft's q (and its sampled rule) at positions holding a lookup token."""
    from specdec.engine.tree_merge import union

    p_root, q_root, p_after, q_after, p_deeper = laws
    tokens, parents = [], []
    for a in _draw_children(q_root, 2, WITH_REPLACEMENT, gen):
        tokens.append(a)
        parents.append(ROOT)
        tokens.append(_draw_children(q_after[a], 1, WITH_REPLACEMENT, gen)[0])
        parents.append(len(tokens) - 2)
    sampled = TokenTree(tokens, parents, torch.zeros(len(tokens) + 1, V), WITH_REPLACEMENT)
    tree = union([sampled, TokenTree(list(LOOKUP), [ROOT, 0])])
    q_rows, p_rows = [q_root], [p_root]
    for i, token in enumerate(tree.tokens):
        first = tree.tokens[tree.parents[i]] if tree.parents[i] != ROOT else None
        q_rows.append(q_after[token] if first is None else torch.zeros(V))
        p_rows.append(p_after[token] if first is None else p_deeper[first, token])
    if keep_q:
        tree = TokenTree(tree.tokens, tree.parents, torch.stack(q_rows), WITH_REPLACEMENT)
    return tree, torch.stack(p_rows)


def merged_pairs(keep_q: bool, n: int = N) -> torch.Tensor:
    return stream_pairs(lambda laws, gen: merged_tree(laws, gen, keep_q), n, seed=1)


def test_merged_sampled_and_lookup_children_follow_p():
    """The union's positions mix a sampled draft's children with a lookup's (deterministic) ones; the
    deterministic rule at every merged position (accept x with p(x), else zero p(x), renormalise) is exact."""
    tree, _ = merged_tree(_laws(), torch.Generator().manual_seed(0))
    assert LOOKUP[0] in [tree.tokens[c] for c in tree.children(ROOT)] and set(tree.drawn) == {DETERMINISTIC}
    first, joint = pvalues(merged_pairs(keep_q=False))
    assert first > ALPHA and joint > ALPHA, (first, joint)


def test_keeping_the_drafts_q_at_a_merged_position_fails_the_same_test():
    """Negative control: judged by the sampled rule with the draft's q, the lookup's token 0 (q(0) = 0) is
    always accepted, so the output over-weights it."""
    first, joint = pvalues(merged_pairs(keep_q=True))
    assert min(first, joint) < 1e-4, (first, joint)
