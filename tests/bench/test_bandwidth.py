"""The engine benchmark's bandwidth figures: the machine's, measured, and the weight bytes a decoding step reads."""

import torch

from specdec_bench.bandwidth import file_bytes, machine_bandwidth, weight_bytes
from specdec.models.gguf_codes import q4k_codes, quantize_q4k
from specdec.models.int4 import Int4Linear


def test_weight_bytes_count_tied_weights_once_and_not_the_int4_prefill_copies():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(100, 256)
    head = torch.nn.Linear(256, 100, bias=False)
    head.weight = embed.weight  # tied, as the small Qwen models are
    int4 = Int4Linear(q4k_codes(quantize_q4k(torch.randn(64, 256)), 256), dense_rows=4)
    assert int4.dense is not None  # the dense copy exists, for long prefills only
    model = torch.nn.Sequential(embed, int4, head)
    expected = 100 * 256 * 4 + sum(t.numel() * t.element_size() for t in (int4.packed, int4.scales_and_zeros))
    assert weight_bytes(model) == expected


def test_machine_bandwidth_is_measured_and_plausible():
    measured = machine_bandwidth(megabytes=16, repeats=2)
    assert measured["megabytes"] == 16 and measured["repeats"] == 2 and measured["threads"] >= 1
    assert 0.1 < measured["read_gbps"] < 10_000 and 0.1 < measured["copy_gbps"] < 10_000


def test_a_gguf_counts_as_its_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\0" * 1234)
    assert file_bytes(path) == 1234
