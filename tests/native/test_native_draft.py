"""The draft on the native forward (issue #42, round 2): a Qwen2 GGUF draft loads beside the target on the target's
forward, from its codes (no bf16 conversion), and takes per-request LoRA adapters as side matmuls beside the
packed base: the adapter adapts it as peft adapts the transformers draft, switching changes the output and
switching back restores it bit for bit, and the server's engine path serves it."""

import json
from pathlib import Path

import pytest
import torch
from native_models import MIXED, _cached_gguf, hf_model, kernels_or_skip, native_model
from test_native_vs_transformers import TOKENS, dequantized_transformers

import tiny
from gguf_files import write_qwen2_gguf
from specdec.errors import SpecdecError

MODULES = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]  # k and gate left out: fused columns left alone


def adapter(path, seed: int, modules=MODULES, r: int = 4, **lora):
    """A peft adapter over the tiny native models' transformers twin (hf_model), B random so it changes logits."""
    from peft import LoraConfig, get_peft_model

    from specdec.models.lora import ignore_peft_checkpointing_notice

    ignore_peft_checkpointing_notice()
    peft_model = get_peft_model(hf_model(), LoraConfig(r=r, lora_alpha=2 * r, target_modules=modules, **lora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    peft_model.save_pretrained(path)
    return path


def peft_logits(path, base):
    """transformers' Qwen2 (`base`) with the adapter as peft runs it, unmerged, fp32."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(path)).eval()(torch.tensor([TOKENS])).logits[0].detach()


def native_logits(model):
    return model.new_cached_lm().extend(TOKENS)


def test_an_adapter_on_the_dense_reference_is_what_peft_computes(tmp_path):
    """Same dequantized weights, fp32 both sides: the side matmuls (fused Q|K|V with K left alone, V in another
    kernel part in layer 1, gate|up with gate left alone, alpha/r scaling) are peft's LoRA to float rounding."""
    from specdec.native.lora import NativeAdapters

    path = adapter(tmp_path / "a", 1)
    expected = peft_logits(path, dequantized_transformers())
    base = dequantized_transformers()(torch.tensor([TOKENS])).logits[0].detach()
    assert (expected - base).abs().max() > 0.05 * base.abs().max()  # the adapter matters
    model = native_model(dense=True, cache_dtype=torch.float32)
    draft = NativeAdapters(model)
    assert draft.activate("a", path)
    got = native_logits(model)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-4 * expected.abs().max().item())
    draft.activate(None)


def test_on_the_kernels_the_adapter_adds_no_error_of_its_own(tmp_path):
    """On W4A8/W8A8 the base is quantized differently from the float one (activations rounded to int8; a random
    tiny model amplifies it), so the native draft's logits with the adapter are compared with the dense
    reference's with the same adapter: they differ by what the kernels' rounding already costs without it, and
    far less than the adapter moves them. Layer 1's V runs in its own kernel part here (Q5_0 beside Q4_K)."""
    kernels_or_skip()
    from specdec.native.lora import NativeAdapters

    path = adapter(tmp_path / "a", 1)
    logits = {}
    for dense in (True, False):
        model = native_model(dense=dense, cache_dtype=torch.float32)
        draft = NativeAdapters(model)
        logits[dense, None] = native_logits(model)
        draft.activate("a", path)
        logits[dense, "a"] = native_logits(model)
        draft.activate(None)
    assert len(NativeAdapters(native_model()).places) == 2 * 7

    def error(got, expected):
        return float((got - expected).norm() / expected.norm())

    rounding = error(logits[False, None], logits[True, None])
    assert error(logits[False, "a"], logits[True, "a"]) < 1.25 * rounding
    assert error(logits[False, "a"], logits[True, None]) > 1.5 * rounding  # the adapter moves them further


def test_switching_per_request_changes_the_output_and_switching_back_restores_it_bitwise(tmp_path):
    kernels_or_skip()
    from specdec.native.lora import NativeAdapters

    model = native_model()
    draft = NativeAdapters(model)
    base = native_logits(model)
    assert draft.activate("a", adapter(tmp_path / "a", 1)) and not draft.activate("a")
    out_a = native_logits(model)
    assert draft.activate("b", adapter(tmp_path / "b", 2, modules=["k_proj", "gate_proj"], r=8))
    out_b = native_logits(model)
    assert not torch.equal(out_a, base) and not torch.equal(out_b, base) and not torch.equal(out_a, out_b)
    draft.activate(None)
    assert torch.equal(native_logits(model), base)
    draft.activate("a")  # already read: no path needed
    assert torch.equal(native_logits(model), out_a)
    with pytest.raises(SpecdecError, match="in use"):
        draft.unload("a")
    assert draft.unload("b") and not draft.unload("b") and list(draft.loaded) == ["a"]


def test_a_bad_adapter_is_one_line_and_leaves_the_draft_as_it_was(tmp_path):
    from adapter_files import spoil
    from specdec.native.lora import NativeAdapters

    model = native_model(dense=True, cache_dtype=torch.float32)
    draft = NativeAdapters(model)
    draft.activate("a", adapter(tmp_path / "a", 1))
    before = native_logits(model)
    for how in ("nan", "shape", "garbage", "huge"):
        with pytest.raises(SpecdecError) as caught:
            draft.activate(how, spoil(adapter(tmp_path / how, 3), how))
        assert "\n" not in str(caught.value) and draft.active == "a"
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter_config.json").write_text(json.dumps({"target_modules": ["embed_tokens"], "r": 4}))
    with pytest.raises(SpecdecError, match="cannot switch"):
        draft.activate("other", other)
    with pytest.raises(SpecdecError, match="DoRA"):
        draft.activate("dora", adapter(tmp_path / "dora", 1, use_dora=True))
    mismatched = tmp_path / "mismatched"  # made for tiny.model's 64-wide layers, not these 256-wide ones
    from adapter_files import random_adapter

    with pytest.raises(SpecdecError, match="the draft's layer is"):
        draft.activate("mismatched", random_adapter(mismatched, 1))
    assert torch.equal(native_logits(model), before) and set(draft.loaded) == {"a"}


@pytest.fixture
def gguf_pair(tmp_path):
    """A target and a draft GGUF with the same tokenizer in each file."""
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    write_qwen2_gguf(hf_model(seed=0), target, types=MIXED, tokenizer=tiny.tokenizer())
    write_qwen2_gguf(hf_model(seed=0), draft, types=MIXED, tokenizer=tiny.tokenizer())
    return target, draft


def test_the_draft_takes_the_targets_forward_where_it_can(gguf_pair, tmp_path):
    kernels_or_skip()
    from specdec.native import loading
    from specdec.native.layers import ops_available

    if not ops_available():
        pytest.skip("the native ops cannot run here")
    from specdec.models.loading import load_pair
    from specdec.native.lm import NativeModel

    target, draft = gguf_pair
    pair = load_pair(str(target), str(draft), target_quant="auto", forward="native")
    assert isinstance(pair.draft.model, NativeModel) and isinstance(pair.target.model, NativeModel)
    # the draft in its own form (NATIVE_DRAFT_FORM int4: nothing on W8A8), the target int8 beside its Q4_K codes
    kernels = {name: {p.kernel for layer in lm.model.model.weights.layers for p in (*layer.qkv.parts, layer.down)}
               for name, lm in (("draft", pair.draft), ("target", pair.target))}
    assert kernels == {"draft": {"w4a8"}, "target": {"w4a8", "w8a8"}}
    assert pair.draft.model.model.weights.output.kernel == "w4a8"
    assert not list(tmp_path.glob("**/*.safetensors"))  # no bf16 conversion of either
    conversion = tmp_path / "conversion"  # what `resolve` makes for fine-tuning: it names its GGUF
    conversion.mkdir()
    (conversion / "specdec.json").write_text(json.dumps({"gguf": str(draft)}))
    (conversion / "model.safetensors").write_bytes(b"bf16 weights")
    from specdec.models.loading import LoadedModel

    # an adapter fine-tuned over the conversion is found for the native draft
    assert LoadedModel("d", conversion, None, None).weight_hash == pair.draft.weight_hash
    assert loading.choose_draft("auto", str(draft)) == draft
    assert loading.choose_draft("transformers", str(draft)) is None
    assert loading.choose_draft("auto", str(draft), draft_quant="int8-down-fp32") is None  # transformers' mode
    with pytest.raises(SpecdecError, match="--forward native cannot run the draft .*draftQuant int8"):
        loading.choose_draft("native", str(draft), draft_quant="none")
    fixed = load_pair(str(target), str(draft), target_quant="auto", forward="native",
                      adapter=str(adapter(tmp_path / "fixed", 1)))
    ids = torch.tensor(TOKENS[:12])
    with_adapter = fixed.draft.model.new_cached_lm().extend(ids.tolist())
    assert not torch.equal(with_adapter, pair.draft.model.new_cached_lm().extend(ids.tolist()))


def test_the_engine_serves_per_request_adapters_on_the_native_draft(gguf_pair, tmp_path):
    """build() -> LocalBackend, as the server runs it: the workspace's adapter switched per request on the native
    draft; greedy output stays the target's (lossless) with and without it."""
    kernels_or_skip()
    from specdec.native.layers import ops_available

    if not ops_available():
        pytest.skip("the native ops cannot run here")
    from types import SimpleNamespace

    from specdec.backends.base import CompletionRequest
    from specdec.backends.local import LoadSpec, LocalBackend, build
    from specdec.native.lora import NativeAdapters

    target, draft = gguf_pair
    path = adapter(tmp_path / "a", 1)

    class Backend(LocalBackend):
        def adapter_for(self, workspace):
            return SimpleNamespace(name="repo@v1") if workspace == "/with" else None

        def adapter_file(self, meta):
            return path

    built = build(LoadSpec(str(target), str(draft), strategy="draft", forward="native", switchable_adapters=True))
    assert isinstance(built.switchable, NativeAdapters) and built.draft_model is built.switchable.model
    backend = Backend()
    backend.completer, backend.switchable = built.completer, built.switchable
    outputs = {}
    for workspace in ("/with", "", "/with"):
        request = CompletionRequest.from_dict({"prefix": "def add(a, b):\n    return", "suffix": "\n",
                                               "workspace": workspace, "max_new_tokens": 12})
        result = backend.complete(request)
        assert built.switchable.active == ("repo@v1" if workspace else None) and backend.adapter == (
            "repo@v1" if workspace else "")
        assert outputs.setdefault(workspace, result.text) == result.text
    assert outputs["/with"] == outputs[""]  # the draft only proposes: greedy output is the target's


def test_int4_groups_rounds_as_the_kernel_reads_it():
    from specdec.models.gguf_codes import int4_groups, int8_per_channel

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(32, 128, generator=gen) * 0.05
    weight[3, 7] = 1.0  # an outlier: its group clips rather than coarsen the other 31
    codes = int4_groups(weight)
    assert codes.codes.dtype == torch.uint8 and int(codes.codes.max()) <= 15
    assert torch.equal(codes.scale, codes.scale.bfloat16().float()) and torch.equal(codes.zero,
                                                                                    codes.zero.bfloat16().float())
    error = (codes.dequantize() - weight).pow(2).mean() / weight.pow(2).mean()
    int8_error = (int8_per_channel(weight).dequantize() - weight).pow(2).mean() / weight.pow(2).mean()
    assert int8_error < error < 0.01


def test_the_int4_form_runs_every_matrix_on_w4a8_and_keeps_a_cache_file_of_its_own(tmp_path, monkeypatch):
    """read_qwen2(int4=True): the matrices that are not Q4_K rounded to int4 per group (the draft's cheaper
    step); the cache keeps it beside the int8 form, never in its place."""
    kernels_or_skip()
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    from specdec.native.gguf_weights import read_qwen2
    from specdec.native.lm import NativeModel
    from specdec.native.qwen2 import Qwen2
    from specdec.native.weights_cache import cache_path, read_qwen2_cached

    gguf = _cached_gguf(0, 2, False)
    weights = read_qwen2(gguf, int4=True)
    kernels = {part.kernel for layer in weights.layers for part in (*layer.qkv.parts, layer.o, *layer.gate_up.parts,
                                                                    layer.down)} | {weights.output.kernel}
    assert kernels == {"w4a8"} and all(len(layer.qkv.parts) == 1 for layer in weights.layers)
    dense = native_logits(native_model(dense=True, cache_dtype=torch.float32))
    int8 = native_logits(native_model(cache_dtype=torch.float32))
    int4 = native_logits(NativeModel(Qwen2(weights), 512, cache_dtype=torch.float32))

    def error(got):
        return float((got - dense).norm() / dense.norm())

    assert error(int8) < error(int4) < 4 * error(int8)  # coarser, not another model
    cached = read_qwen2_cached(gguf, int4=True)
    assert cache_path(Path(gguf), int4=True).is_file() and not cache_path(Path(gguf)).exists()
    again = read_qwen2_cached(gguf, int4=True)  # mapped from its file
    assert torch.equal(again.output.packed, cached.output.packed) and again.output.kernel == "w4a8"
    from specdec.models.cache_inventory import NATIVE_PREFIX, native_stale

    # `models list` and `models prune` read it as its GGUF's native file, current
    assert cache_path(Path(gguf), int4=True).name.startswith(f"{NATIVE_PREFIX}{Path(gguf).stem}-")
    assert native_stale(cache_path(Path(gguf), int4=True), Path(gguf)) == ""


async def test_the_server_serves_a_workspaces_adapter_on_the_native_draft(gguf_pair, tmp_path):
    """`specdec serve` with a GGUF pair (both on the native forward): repository A's registered adapter (made for
    this draft: its GGUF's identity) is switched in for A's requests, B's run on the base draft."""
    kernels_or_skip()
    from specdec.native.layers import ops_available

    if not ops_available():
        pytest.skip("the native ops cannot run here")
    import os

    import lsp_client as lc
    from repos import make_repo
    from specdec.models.loading import LoadedModel
    from specdec_adapters.registry import AdapterMeta, Registry, repo_identity

    target, draft = gguf_pair
    repo_a, repo_b = make_repo(tmp_path / "a", files=3), make_repo(tmp_path / "b", files=3)
    env = {"SPECDEC_DATA_DIR": str(tmp_path / "data")}
    os.environ["SPECDEC_DATA_DIR"] = env["SPECDEC_DATA_DIR"]
    key_a = repo_identity(repo_a)[0]
    Registry().register(adapter(tmp_path / "adapter", 1), AdapterMeta(
        repo_key=key_a, version="", repo_root=str(repo_a), git_remote="", git_commit="", base_draft=str(draft),
        base_draft_hash=LoadedModel(str(draft), draft, None, None).weight_hash, target=str(target)))
    client = await lc.start(tmp_path, {"target": str(target), "draft": str(draft), "debounceMs": 0,
                                       "maxNewTokens": 8, "strategy": "draft"},
                            env=env, workspace=repo_a, folders=[repo_a, repo_b])
    try:
        assert (await lc.wait_ready(client))["model"]["state"] == "ready"
        for repo in (repo_a, repo_b, repo_a):
            uri = (repo / "mod_1.py").as_uri()
            lc.open_doc(client, uri, (repo / "mod_1.py").read_text())
            await lc.inline(client, uri, 4, 4, invoked=True)
        stats = await lc.stats(client)
        rows = {(r["workspace"], r["adapter"]): r for r in stats["adapters"]}
        assert rows[(str(repo_a), f"{key_a}@v1")]["model_requests"] >= 1, rows
        assert rows[(str(repo_b), "base")]["model_requests"] == 1, rows
        assert stats["model"]["adapter"] == f"{key_a}@v1" and not stats["model"]["adapter_error"]
        assert not list((tmp_path / "cache").glob("**/*.safetensors"))  # neither model went through transformers
    finally:
        await client.shutdown_session()
        await client.stop()
