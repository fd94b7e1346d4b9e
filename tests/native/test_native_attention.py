"""The native attention's bits against an emulation of its documented arithmetic (kernels_impl.h, "attention"):
per key and head a 16-lane fma dot product over D in chunk order (a zero-padded last chunk), the fixed tree
(lanes i + i+8, i + i+4, i + i+2, i + i+1), times scale; in blocks of 32 keys aligned to logical index 0 the block
max by the same tree, p = exp(s - m_new) (the ops' own exp), the block sum over its two 16-lane halves, l and acc
scaled by exp(m_old - m_new) after the first block, acc = fma(p_t, v_t, acc) with the keys in order, out = acc / l.
The emulation does each of those roundings once, in float32 (an fma through float64 with an exact correction), so
an output equal bit for bit means the kernel performs exactly that sequence of operations, however it vectorises
it (issue #42: the reduction of 16 keys at once must not change a bit)."""

from fractions import Fraction

import pytest
import torch

from specdec.native import ops

pytestmark = pytest.mark.skipif(not ops.available(), reason=f"native ops unavailable: {ops.unavailable_reason()}")

BLOCK = 32
INF = float("inf")


@pytest.fixture(params=("avx512", "avx2"))
def isa(request):
    if request.param == "avx512" and ops.cpu_isa() != "avx512":
        pytest.skip("the CPU lacks AVX512F: the avx512 path cannot run here")
    with ops.use_isa(request.param):
        yield request.param


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fused multiply-add, correctly rounded: a * b is exact in float64, the sum's rounding error is exact
    by TwoSum, and the one case where rounding s = fl64(a*b + c) to float32 differs from rounding the exact sum
    (s exactly halfway between two floats) is decided by the error's sign."""
    p = a.double() * b.double()
    c64 = c.double()
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    r = s.float()
    below = torch.where(r.double() > s, torch.nextafter(r, torch.tensor(-INF)), r)  # the float just <= s
    above = torch.nextafter(below, torch.tensor(INF))
    halfway = (s == (below.double() + above.double()) / 2) & (err != 0)
    return torch.where(halfway, torch.where(err > 0, above, below), r)


def tree(x: torch.Tensor, op) -> torch.Tensor:
    """The fixed 16-lane tree over the last dim: (i, i+8), (i, i+4), (i, i+2), (0, 1), lower lane first."""
    for half in (8, 4, 2, 1):
        x = op(x[..., :half], x[..., half:2 * half])
    return x[..., 0]


def vmax(a, b):
    return torch.where(a > b, a, b)  # maxps(a, b): a where a > b, else b


def emulate_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: list[int], scale: float) -> torch.Tensor:
    """q f32[H, D] (heads sharing one kv head), k and v f32[S, D] of that kv head, slots in logical order
    -> f32[H, D], the kernel's documented arithmetic."""
    H, D = q.shape
    chunks = (D + 15) // 16
    pad = chunks * 16 - D
    qp = torch.nn.functional.pad(q, (0, pad))
    kp = torch.nn.functional.pad(k[slots], (0, pad))
    vp = torch.nn.functional.pad(v[slots], (0, pad))
    L = len(slots)
    if L == 0:
        return torch.zeros(H, D)
    dot = torch.zeros(H, L, 16)
    for c in range(chunks):
        lanes = slice(c * 16, c * 16 + 16)
        dot = fma32(qp[:, None, lanes], kp[None, :, lanes], dot)
    scores = tree(dot, torch.add) * torch.tensor(scale, dtype=torch.float32)  # [H, L]
    m = torch.full((H,), -INF)
    l = torch.zeros(H)
    acc = torch.zeros(H, chunks * 16)
    for b0 in range(0, L, BLOCK):
        count = min(BLOCK, L - b0)
        s = torch.full((H, BLOCK), -INF)
        s[:, :count] = scores[:, b0:b0 + count]
        m_block = tree(vmax(s[:, :16], s[:, 16:]), vmax)
        m_new = torch.where(m > m_block, m, m_block)
        e = ops.exp(s - m_new[:, None])
        e[:, count:] = 0.0
        l_block = tree(e[:, :16] + e[:, 16:], torch.add)
        if b0 == 0:
            l = l_block
        else:
            corr = ops.exp(m - m_new)
            l = l * corr + l_block
            acc = acc * corr[:, None]
        m = m_new
        for t in range(count):
            acc = fma32(e[:, t:t + 1], vp[b0 + t][None, :], acc)
    return (acc / l[:, None])[:, :D]


def emulate(q, k_cache, v_cache, prefix, extra, scale):
    n, Hq, D = q.shape
    Hk = k_cache.shape[0]
    group = Hq // Hk
    out = torch.empty(n, Hq, D)
    for i in range(n):
        slots = list(range(int(prefix[i])))
        for e in extra[i].tolist():
            if e < 0:
                break
            slots.append(e)
        for kh in range(Hk):
            heads = slice(kh * group, (kh + 1) * group)
            out[i, heads] = emulate_row(q[i, heads], k_cache[kh].float(), v_cache[kh].float(), slots, scale)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("hq,hk,d", [(14, 2, 64), (12, 2, 128), (3, 1, 40), (8, 1, 16), (2, 2, 24)])
def test_attention_bits_equal_the_documented_arithmetic(isa, dtype, hq, hk, d):
    """Rows ending on both sides of block and 16-key boundaries, tree slots (`extra`) in any cache position, head
    groups from 1 to 14 (sliced into calls of at most 8), head sizes with and without a partial last chunk."""
    g = torch.Generator().manual_seed(hq * 1000 + d)
    S = 120
    k = (torch.randn(hk, S, d, generator=g) * 2).to(dtype)
    v = torch.randn(hk, S, d, generator=g).to(dtype)
    prefix = torch.tensor([0, 1, 15, 16, 17, 31, 32, 33, 48, 64, 65, 97])
    n = len(prefix)
    q = torch.randn(n, hq, d, generator=g) * 2
    extra = torch.full((n, 3), -1, dtype=torch.long)
    extra[0, :1] = torch.tensor([5])
    extra[3, :3] = torch.tensor([110, 7, 111])
    extra[7, :2] = torch.tensor([119, 33])
    extra[11, :3] = torch.tensor([100, 101, 102])
    scale = d ** -0.5
    out = ops.attention(q, k, v, prefix, extra, scale)
    ref = emulate(q, k, v, prefix, extra, scale)
    assert torch.equal(out, ref), (out - ref).abs().max()


def test_emulation_tells_a_different_summation_order_apart():
    """The check above can fail: summing each key's 16 lanes left to right instead of by the tree changes bits."""
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 64, generator=g) * 2, torch.randn(40, 64, generator=g) * 2
    dot = torch.zeros(1, 40, 16)
    for c in range(4):
        dot = fma32(q[:, None, c * 16:c * 16 + 16], k[None, :, c * 16:c * 16 + 16], dot)
    by_tree = tree(dot, torch.add)
    in_order = dot[..., 0]
    for i in range(1, 16):
        in_order = in_order + dot[..., i]
    assert not torch.equal(by_tree, in_order)


def exact_fma32(a: float, b: float, c: float) -> float:
    """fma by exact rational arithmetic, rounded to the nearest float32 (ties to even)."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    r = torch.tensor([float(exact)]).float()
    candidates = [torch.nextafter(r, torch.tensor([-INF])), r, torch.nextafter(r, torch.tensor([INF]))]
    best = min(candidates, key=lambda x: (abs(Fraction(x.item()) - exact), x.view(torch.int32).item() & 1))
    return best.item()


def test_fma32_is_correctly_rounded():
    """fma32 against exact rational arithmetic: a crafted case where rounding the float64 sum to float32 would be
    wrong (the sum lands exactly on a tie that the exact value is just below), then random cases."""
    a = torch.tensor([2.0 ** -24 * (1 + 2.0 ** -18)])
    b = torch.tensor([1 - 2.0 ** -18])
    c = torch.tensor([1 + 2.0 ** -23])  # exact: 1 + 2^-23 + 2^-24 - 2^-60, just below the tie
    naive = (a.double() * b.double() + c.double()).float()
    assert naive.item() == 1 + 2.0 ** -22  # double rounding goes to the even neighbour
    assert fma32(a, b, c).item() == 1 + 2.0 ** -23 == exact_fma32(a.item(), b.item(), c.item())
    g = torch.Generator().manual_seed(3)
    x, y, z = (torch.randn(3000, generator=g) * 4 for _ in range(3))
    z[:1000] = -(x[:1000].double() * y[:1000].double()).float()  # heavy cancellation
    got = fma32(x, y, z)
    for i in range(len(x)):
        assert got[i].item() == exact_fma32(x[i].item(), y[i].item(), z[i].item()), i
