"""The native ops' exactness contract (specdec/native/ops.py): a row's bits depend only on that row and the keys
it may see — not on the rows beside it, the padding of `extra`, where in the cache its keys sit, the thread
count or the instruction set — and the results are close to torch's references. Every test runs once per
instruction-set path this CPU has; the path is in the test id (`[avx512]`, `[avx2]`)."""

import pytest
import torch
import torch.nn.functional as F

from specdec.native import ops

pytestmark = pytest.mark.skipif(not ops.available(), reason=f"native ops unavailable: {ops.unavailable_reason()}")

PATHS = ("avx512", "avx2")
EPS = 1e-6


@pytest.fixture(params=PATHS)
def isa(request):
    """Runs the test on one instruction-set path; skipped where the CPU lacks it."""
    if request.param == "avx512" and ops.cpu_isa() != "avx512":
        pytest.skip("the CPU lacks AVX512F: the avx512 path cannot run here")
    with ops.use_isa(request.param):
        assert ops.isa() == request.param
        yield request.param


def both_paths(fn):
    """fn() on the AVX512 and the AVX2 path; skips where the CPU has no AVX512."""
    if ops.cpu_isa() != "avx512":
        pytest.skip("the CPU lacks AVX512F: nothing to compare the avx2 path with")
    with ops.use_isa("avx512"):
        a = fn()
    with ops.use_isa("avx2"):
        b = fn()
    return a, b


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ---- exp ------------------------------------------------------------------------------------------------------

def test_exp_is_accurate(isa):
    x = torch.linspace(-87, 88, 200_001)
    ref = torch.exp(x.double())
    rel = ((ops.exp(x).double() - ref) / ref).abs().max().item()
    assert rel < 4e-7  # a few ulp


def test_exp_clamps_instead_of_overflowing(isa):
    out = ops.exp(torch.tensor([-1e30, -200.0, 200.0, 1e30]))
    assert torch.isfinite(out).all()
    assert out[0] == out[1] > 0 and out[2] == out[3] > 1e38


def test_exp_tail_lanes_equal_full_lanes(isa):
    x = torch.randn(16 * 5, generator=gen(1)) * 20
    full = ops.exp(x)
    for count in (1, 7, 15, 17, 33, 79):
        assert torch.equal(ops.exp(x[:count]), full[:count]), count


def test_exp_same_bits_on_both_paths():
    x = torch.cat([torch.linspace(-90, 90, 100_003), torch.randn(1000, generator=gen(2))])
    a, b = both_paths(lambda: ops.exp(x))
    assert torch.equal(a, b)


# ---- rms_norm, add_rms_norm -----------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [1536, 896, 100, 17, 1])
def test_rms_norm_matches_torch(isa, d):
    x = torch.randn(9, d, generator=gen(d)) * 3
    w = torch.rand(d, generator=gen(d + 1)) + 0.5
    torch.testing.assert_close(ops.rms_norm(x, w, EPS), F.rms_norm(x, (d,), w, EPS), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("d", [1536, 100])
def test_rms_norm_row_alone_equals_row_in_any_batch(isa, d):
    rows = torch.randn(33, d, generator=gen(3))
    w = torch.rand(d, generator=gen(4)) + 0.5
    alone = torch.cat([ops.rms_norm(rows[i:i + 1], w, EPS) for i in range(33)])
    for k in range(1, 34):
        assert torch.equal(ops.rms_norm(rows[:k], w, EPS), alone[:k]), k
    assert torch.equal(ops.rms_norm(rows.flip(0), w, EPS), alone.flip(0))


def test_add_rms_norm_updates_residual_and_normalises_it(isa):
    d = 1536
    x = torch.randn(5, d, generator=gen(5))
    residual = torch.randn(5, d, generator=gen(6))
    w = torch.rand(d, generator=gen(7)) + 0.5
    expected_residual = residual + x
    out = ops.add_rms_norm(x, residual, w, EPS)
    assert torch.equal(residual, expected_residual)
    assert torch.equal(out, ops.rms_norm(expected_residual, w, EPS))


def test_add_rms_norm_row_alone_equals_row_in_any_batch(isa):
    d = 1536
    x = torch.randn(33, d, generator=gen(8))
    res = torch.randn(33, d, generator=gen(9))
    w = torch.rand(d, generator=gen(10)) + 0.5
    alone = torch.cat([ops.add_rms_norm(x[i:i + 1], res[i:i + 1].clone(), w, EPS) for i in range(33)])
    for k in (1, 2, 3, 8, 17, 33):
        assert torch.equal(ops.add_rms_norm(x[:k], res[:k].clone(), w, EPS), alone[:k]), k


def test_norms_same_bits_on_both_paths():
    x = torch.randn(7, 1550, generator=gen(11)) * 4
    w = torch.rand(1550, generator=gen(12))
    a, b = both_paths(lambda: ops.rms_norm(x, w, EPS))
    assert torch.equal(a, b)
    a, b = both_paths(lambda: ops.add_rms_norm(x, x.clone() * 0.5, w, EPS))
    assert torch.equal(a, b)


# ---- silu_mul -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("I", [8960, 4864, 37, 5])
def test_silu_mul_matches_torch(isa, I):
    gu = torch.randn(4, 2 * I, generator=gen(I)) * 6
    ref = F.silu(gu[:, :I]) * gu[:, I:]
    torch.testing.assert_close(ops.silu_mul(gu), ref, rtol=2e-6, atol=2e-6)


def test_silu_mul_row_alone_equals_row_in_any_batch(isa):
    I = 8960
    gu = torch.randn(33, 2 * I, generator=gen(13)) * 4
    alone = torch.cat([ops.silu_mul(gu[i:i + 1]) for i in range(33)])
    for k in (1, 2, 5, 16, 33):
        assert torch.equal(ops.silu_mul(gu[:k]), alone[:k]), k


def test_silu_mul_extreme_inputs_stay_finite(isa):
    gu = torch.tensor([[-1e4, 0.0, 1e4, 3.0, 2.0, 2.0]])
    out = ops.silu_mul(gu)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 2e4]]), rtol=1e-6, atol=1e-6)


def test_silu_mul_same_bits_on_both_paths():
    gu = torch.randn(3, 2 * 1000 + 2, generator=gen(14)) * 8
    a, b = both_paths(lambda: ops.silu_mul(gu))
    assert torch.equal(a, b)


# ---- attention ------------------------------------------------------------------------------------------------

HQ, HK, D = 12, 2, 128
SCALE = D ** -0.5
PREFIXES = (1, 31, 32, 33, 63, 64, 65, 100, 257)


def cache(slots, dtype, seed, hk=HK, d=D):
    g = gen(seed)
    return (torch.randn(hk, slots, d, generator=g).to(dtype), torch.randn(hk, slots, d, generator=g).to(dtype))


def reference(q_row, k, v, visible):
    """SDPA over the visible slots of one row, in float64: q_row f32[Hq, D] -> f32[Hq, D]."""
    group = q_row.shape[0] // k.shape[0]
    kk = k[:, visible].double().repeat_interleave(group, 0)
    vv = v[:, visible].double().repeat_interleave(group, 0)
    scale = q_row.shape[-1] ** -0.5
    return F.scaled_dot_product_attention(q_row.double().unsqueeze(1), kk, vv, scale=scale).squeeze(1).float()


def no_extra(n, width=0):
    return torch.full((n, width), -1, dtype=torch.long)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_attention_matches_sdpa_across_block_boundaries(isa, dtype):
    k, v = cache(300, dtype, 20)
    q = torch.randn(len(PREFIXES), HQ, D, generator=gen(21))
    prefix = torch.tensor(PREFIXES)
    out = ops.attention(q, k, v, prefix, no_extra(len(PREFIXES), 2), SCALE)
    for i, p in enumerate(PREFIXES):
        torch.testing.assert_close(out[i], reference(q[i], k, v, list(range(p))), rtol=1e-5, atol=2e-6)


def test_tree_pass_matches_sdpa_with_the_tree_mask(isa):
    """A whole verify pass against torch's SDPA in fp32 over the cache with a boolean mask (prefix + ancestors)."""
    p, parents = 70, [-1, 0, 0, 1, 1, 2, 5, 6]
    k, v = cache(p + len(parents), torch.bfloat16, 43)
    q = torch.randn(len(parents), HQ, D, generator=gen(44))
    extra = no_extra(len(parents), 6)
    mask = torch.zeros(len(parents), p + len(parents), dtype=torch.bool)
    mask[:, :p] = True
    for u in range(len(parents)):
        path, w = [], u
        while w >= 0:
            path.append(p + w)
            w = parents[w]
        extra[u, :len(path)] = torch.tensor(path[::-1])
        mask[u, path] = True
    out = ops.attention(q, k, v, torch.full((len(parents),), p), extra, SCALE)
    kk = k[:, :p + len(parents)].float().repeat_interleave(HQ // HK, 0)
    vv = v[:, :p + len(parents)].float().repeat_interleave(HQ // HK, 0)
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask, scale=SCALE).transpose(0, 1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("hq,hk,d", [(4, 4, 64), (14, 2, 64), (3, 1, 40)])
def test_attention_heads_and_head_sizes(isa, hq, hk, d):
    """GQA (head h reads kv head h // (Hq / Hk)), plain multi-head, and a head size with a partial 16-lane chunk."""
    k, v = cache(80, torch.float32, 22, hk=hk, d=d)
    q = torch.randn(3, hq, d, generator=gen(23))
    prefix = torch.tensor([5, 33, 70])
    extra = torch.tensor([[75, 79], [-1, -1], [71, -1]])
    out = ops.attention(q, k, v, prefix, extra, d ** -0.5)
    for i in range(3):
        visible = list(range(int(prefix[i]))) + [int(s) for s in extra[i] if s >= 0]
        torch.testing.assert_close(out[i], reference(q[i], k, v, visible), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_chain_rows_equal_decode_steps(isa, dtype):
    """Row j of a k-row verify pass (prefix p, extra = the pass's slots up to j) equals the decode step that sees
    the same keys contiguously (prefix p + j + 1, no extra), for k = 1..33 and p across block boundaries."""
    k, v = cache(257 + 34, dtype, 24)
    q = torch.randn(33, HQ, D, generator=gen(25))
    for p in PREFIXES:
        steps = torch.cat([ops.attention(q[j:j + 1], k, v, torch.tensor([p + j + 1]), no_extra(1), SCALE)
                           for j in range(33)])
        for rows in range(1, 34):
            width = rows if rows % 2 else rows + 7  # E exactly the pass's length, or padded with -1
            extra = no_extra(rows, width)
            for j in range(rows):
                extra[j, :j + 1] = torch.arange(p, p + j + 1)
            out = ops.attention(q[:rows], k, v, torch.full((rows,), p), extra, SCALE)
            assert torch.equal(out, steps[:rows]), (p, rows, width)


def test_row_bits_do_not_depend_on_where_the_prefix_ends(isa):
    """The same visible keys, split between prefix and extra at any point, give the same bits."""
    k, v = cache(200, torch.bfloat16, 26)
    q = torch.randn(1, HQ, D, generator=gen(27))
    whole = ops.attention(q, k, v, torch.tensor([100]), no_extra(1), SCALE)
    for split in (0, 1, 31, 32, 33, 64, 99):
        extra = torch.arange(split, 100).unsqueeze(0)
        assert torch.equal(ops.attention(q, k, v, torch.tensor([split]), extra, SCALE), whole), split


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_tree_rows_equal_the_same_keys_contiguous(isa, dtype):
    """A token tree's nodes at scattered slots, each row seeing the prefix then its ancestors by depth and itself,
    against a cache holding that path right after the prefix: bitwise equal, whatever the tree and batch."""
    g = gen(28)
    for p in PREFIXES:
        nodes = 40
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, nodes)]
        k, v = cache(p + nodes + 20, dtype, 29 + p)
        slots = (torch.randperm(nodes + 20, generator=g)[:nodes] + p).tolist()  # node u lives at slots[u]
        q = torch.randn(nodes, HQ, D, generator=g)
        paths = []
        for u in range(nodes):
            path, w = [], u
            while w >= 0:
                path.append(w)
                w = parents[w]
            paths.append(path[::-1])
        extra = no_extra(nodes, max(len(path) for path in paths) + 3)
        for u, path in enumerate(paths):
            extra[u, :len(path)] = torch.tensor([slots[w] for w in path])
        tree = ops.attention(q, k, v, torch.full((nodes,), p), extra, SCALE)
        for u, path in enumerate(paths):
            kc, vc = k[:, :p + len(path)].clone(), v[:, :p + len(path)].clone()
            kc[:, p:] = k[:, [slots[w] for w in path]]
            vc[:, p:] = v[:, [slots[w] for w in path]]
            alone = ops.attention(q[u:u + 1], kc, vc, torch.tensor([p + len(path)]), no_extra(1), SCALE)
            assert torch.equal(tree[u:u + 1], alone), (p, u)


def test_attention_bits_do_not_depend_on_thread_count(isa):
    k, v = cache(400, torch.bfloat16, 30)
    q = torch.randn(5, HQ, D, generator=gen(31))
    prefix = torch.tensor([1, 64, 65, 300, 399])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.attention(q, k, v, prefix, no_extra(5), SCALE)
        torch.set_num_threads(max(2, before))
        many = ops.attention(q, k, v, prefix, no_extra(5), SCALE)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_attention_same_bits_on_both_paths(dtype):
    k, v = cache(300, dtype, 32)
    q = torch.randn(len(PREFIXES), HQ, D, generator=gen(33))
    extra = torch.tensor([[290, 295, -1]] * len(PREFIXES))
    a, b = both_paths(lambda: ops.attention(q, k, v, torch.tensor(PREFIXES), extra, SCALE))
    assert torch.equal(a, b)
    q40 = torch.randn(2, 3, 40, generator=gen(34))
    k40, v40 = cache(70, dtype, 35, hk=1, d=40)
    a, b = both_paths(lambda: ops.attention(q40, k40, v40, torch.tensor([33, 65]), no_extra(2), 40 ** -0.5))
    assert torch.equal(a, b)


def test_attention_row_that_sees_nothing_is_zero(isa):
    k, v = cache(10, torch.float32, 36)
    out = ops.attention(torch.randn(2, HQ, D, generator=gen(37)), k, v, torch.tensor([0, 3]), no_extra(2, 1), SCALE)
    assert torch.equal(out[0], torch.zeros(HQ, D)) and torch.isfinite(out[1]).all()


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(prefix=torch.tensor([11])), "prefix"),
    (lambda a: a.update(extra=torch.tensor([[3, 10]])), "extra"),
    (lambda a: a.update(q=torch.randn(1, 5, D)), "kv heads"),
    (lambda a: a.update(v_cache=a["v_cache"].float()), "dtype"),
    (lambda a: a.update(q=a["q"].double()), "float32"),
    (lambda a: a.update(k_cache=torch.randn(HK, 10, 64)), "shape"),
])
def test_attention_rejects_bad_input_with_a_clear_error(isa, change, message):
    k, v = cache(10, torch.bfloat16, 38)
    args = dict(q=torch.randn(1, HQ, D), k_cache=k, v_cache=v, prefix=torch.tensor([4]), extra=no_extra(1, 2),
                scale=SCALE)
    change(args)
    with pytest.raises(RuntimeError, match=message):
        ops.attention(**args)


def test_norm_and_silu_reject_bad_input(isa):
    with pytest.raises(RuntimeError, match="weight"):
        ops.rms_norm(torch.randn(2, 8), torch.randn(7), EPS)
    with pytest.raises(RuntimeError, match="even"):
        ops.silu_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="float32"):
        ops.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8), EPS)


# ---- argmax ---------------------------------------------------------------------------------------------------

def test_argmax_takes_the_lowest_index_among_ties():
    V = 151_936
    logits = torch.randn(6, V, generator=gen(39))
    ties = [(3, 4), (0, V - 1), (17, 18, 150_000), (70_000, 140_000), (V - 2, V - 1), (1000, 1016, 1032)]
    for row, positions in enumerate(ties):
        logits[row, list(positions)] = 10.0
    assert ops.argmax(logits).tolist() == [positions[0] for positions in ties]
    for row, positions in enumerate(ties):
        assert ops.argmax(logits[row:row + 1]).item() == positions[0]
    flat = torch.zeros(2, V)
    assert ops.argmax(flat).tolist() == [0, 0]


def test_environment_forces_the_avx2_path():
    import os
    import subprocess
    import sys

    code = "from specdec.native import ops; print(ops.isa())"
    env = {**os.environ, "SPECDEC_NATIVE_ISA": "avx2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "avx2"


def test_isa_can_be_switched_and_rejects_unknown_names():
    assert ops.isa() in PATHS and ops.cpu_isa() in PATHS
    with pytest.raises(RuntimeError, match="expected 'avx2' or 'avx512'"):
        with ops.use_isa("sse2"):
            pass
    with ops.use_isa("avx2"):
        assert ops.isa() == "avx2"


# ---- rope -----------------------------------------------------------------------------------------------------

def hf_rope(x, positions, cos, sin):
    """transformers' apply_rotary_pos_emb on [n, H, D] in fp32, with its [P, D] tables (cat(freqs, freqs))."""
    c = torch.cat([cos, cos], -1)[positions].unsqueeze(1)
    s = torch.cat([sin, sin], -1)[positions].unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * c + rotated * s


@pytest.mark.parametrize("D", [128, 64, 40, 6])
def test_rope_equals_hf_bitwise(isa, D):
    cos, sin = ops.rope_table(4096, D, 1_000_000.0)
    x = torch.randn(9, 5, D, generator=gen(D))
    positions = torch.tensor([0, 1, 31, 32, 100, 511, 2047, 4000, 4095])
    assert torch.equal(ops.rope(x, positions, cos, sin), hf_rope(x, positions, cos, sin))
    full = (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    assert torch.equal(ops.rope(x, positions, *full), hf_rope(x, positions, cos, sin))


def test_rope_table_matches_transformers():
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    config = Qwen2Config(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, rope_theta=1_000_000.0,
                         max_position_embeddings=4096)
    rotary = Qwen2RotaryEmbedding(config)
    positions = torch.arange(4096).unsqueeze(0)
    hf_cos, hf_sin = rotary(torch.zeros(1, 1, dtype=torch.float32), positions)
    cos, sin = ops.rope_table(4096, 128, 1_000_000.0)
    assert torch.equal(torch.cat([cos, cos], -1), hf_cos[0]) and torch.equal(torch.cat([sin, sin], -1), hf_sin[0])


def test_rope_reads_a_view_into_fused_qkv(isa):
    n, hq, hk, D = 4, 12, 2, 128
    qkv = torch.randn(n, (hq + 2 * hk) * D, generator=gen(40))
    k_view = qkv[:, hq * D:(hq + hk) * D].view(n, hk, D)
    cos, sin = ops.rope_table(64, D, 10_000.0)
    positions = torch.tensor([3, 4, 5, 63])
    assert torch.equal(ops.rope(k_view, positions, cos, sin), hf_rope(k_view.contiguous(), positions, cos, sin))


def test_rope_rejects_a_position_outside_the_table(isa):
    cos, sin = ops.rope_table(8, 16, 10_000.0)
    with pytest.raises(RuntimeError, match="outside the tables"):
        ops.rope(torch.randn(1, 2, 16), torch.tensor([8]), cos, sin)


# ---- the floating-point mode ----------------------------------------------------------------------------------

def test_flush_to_zero_on_the_calling_thread_changes_no_bits(isa):
    """Denormal results (silu of a very negative gate times a small up; attention weights near exp's floor)
    come out the same whatever flush-to-zero mode the thread that calls (or runs) the op is in."""
    gu = torch.tensor([[-80.0, -85.0, 3.0, 1e-6, 1e-3, 2.0]])
    k, v = cache(40, torch.float32, 41, hk=1, d=16)
    k[0, :20] *= 60.0  # scores far apart: some weights end near exp(-87)
    v[0] *= 1e-3
    q = torch.randn(2, 1, 16, generator=gen(42)) * 3
    args = (q, k, v, torch.tensor([40, 25]), no_extra(2), 0.25)
    plain = (ops.silu_mul(gu), ops.attention(*args), ops.exp(torch.tensor([-87.0, -86.5])))
    assert plain[0][0, 0] != 0 and abs(plain[0][0, 0]) < torch.finfo(torch.float32).tiny  # a denormal
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        flushed = (ops.silu_mul(gu), ops.attention(*args), ops.exp(torch.tensor([-87.0, -86.5])))
    finally:
        torch.set_flush_denormal(False)
    for a, b in zip(plain, flushed):
        assert torch.equal(a, b)


# ---- qkv_rope_cache -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_qkv_rope_cache_equals_the_unfused_ops(isa, dtype, with_bias):
    n, hq, hk, d, slots_total = 5, 12, 2, 128, 40
    g = gen(45)
    qkv = torch.randn(n, (hq + 2 * hk) * d, generator=g)
    bias = torch.randn((hq + 2 * hk) * d, generator=g) if with_bias else None
    cos, sin = ops.rope_table(64, d, 1_000_000.0)
    positions = torch.tensor([7, 8, 9, 9, 63])
    slots = torch.tensor([3, 4, 39, 0, 20])
    k_cache, v_cache = cache(slots_total, dtype, 46)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q = ops.qkv_rope_cache(qkv, bias, positions, cos, sin, k_cache, v_cache, slots, hq)

    x = qkv + bias if with_bias else qkv
    q_ref = hf_rope(x[:, :hq * d].view(n, hq, d), positions, cos, sin)
    k_ref = hf_rope(x[:, hq * d:(hq + hk) * d].view(n, hk, d), positions, cos, sin).to(dtype)
    v_ref = x[:, (hq + hk) * d:].view(n, hk, d).to(dtype)
    assert torch.equal(q, q_ref)
    k_expected, v_expected = k_before.clone(), v_before.clone()
    k_expected[:, slots] = k_ref.transpose(0, 1)
    v_expected[:, slots] = v_ref.transpose(0, 1)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_qkv_rope_cache_rounds_to_bf16_as_torch_does(isa):
    """Round to nearest even at exact ties, largest finite values, denormals, infinities, signed zeros."""
    d = 16
    specials = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 3.3895314e38, 1e-40, -1e-39,
                             float("inf"), float("-inf"), 0.0, -0.0, 65504.0, 1e-3, 2 ** -126, 7.0, -7.5, 1.0])
    qkv = torch.cat([torch.zeros(d), torch.zeros(d), specials]).unsqueeze(0)  # Hq = 1, Hk = 1: v is `specials`
    cos, sin = ops.rope_table(4, d, 10_000.0)
    k_cache, v_cache = cache(2, torch.bfloat16, 47, hk=1, d=d)
    ops.qkv_rope_cache(qkv, None, torch.tensor([0]), cos, sin, k_cache, v_cache, torch.tensor([1]), 1)
    assert torch.equal(v_cache[0, 1].view(torch.int16), specials.to(torch.bfloat16).view(torch.int16))


def test_qkv_rope_cache_rejects_bad_slots(isa):
    k_cache, v_cache = cache(4, torch.float32, 48, hk=1, d=16)
    cos, sin = ops.rope_table(8, 16, 10_000.0)
    qkv = torch.randn(2, 3 * 16)
    before = k_cache.clone()
    with pytest.raises(RuntimeError, match="written by two rows"):
        ops.qkv_rope_cache(qkv, None, torch.tensor([0, 1]), cos, sin, k_cache, v_cache, torch.tensor([2, 2]), 1)
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.qkv_rope_cache(qkv, None, torch.tensor([0, 1]), cos, sin, k_cache, v_cache, torch.tensor([2, 4]), 1)
    with pytest.raises(RuntimeError, match="columns"):
        ops.qkv_rope_cache(qkv, None, torch.tensor([0, 1]), cos, sin, k_cache, v_cache, torch.tensor([0, 1]), 2)
    assert torch.equal(k_cache, before)  # nothing written


# ---- the library runs on AVX2-only CPUs -----------------------------------------------------------------------

def test_only_the_avx512_namespace_holds_avx512_instructions():
    """The AVX2 path and the dispatch code must run on a CPU without AVX512 (no such CPU here to run them on):
    in the built library, no function outside specdec_native::avx512 uses a zmm or mask register or an EVEX
    encoding (first opcode byte 0x62, an invalid instruction in 64-bit mode otherwise)."""
    from disassembly import instructions

    library = next((path for path in torch.ops.loaded_libraries if "specdec_native" in path), None)
    assert library, torch.ops.loaded_libraries
    offenders, avx512_functions = set(), set()
    for function, avx512, _ in instructions(library):
        if avx512:
            (avx512_functions if "specdec_native::avx512::" in function else offenders).add(function)
    assert avx512_functions, "the avx512 path was not found in the library"
    assert not offenders, sorted(offenders)[:5]
