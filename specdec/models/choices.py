"""What a user chooses for the models, importable without torch (the CLI and the server's settings
validate against these before anything heavy loads)."""

DTYPES = ("auto", "bf16", "fp32")  # auto: bf16 where the device computes it natively, else fp32
# The target's weights: int4 = the GGUF's Q4_K codes as they are (specdec.models.int4), int8 = every
# Linear int8 per channel, none = the dequantized float weights. Lossless in every mode: the
# drafts are checked against whatever target runs.
TARGET_QUANT = ("none", "int4", "int8")
# Linear layers each int8 mode leaves in fp32. Qwen2's MLP output projection sees activation
# outliers (a few channels far larger than the rest) that per-token int8 activations still
# round coarsely. Keeping down_proj fp32 buys a little agreement for a clearly slower draft step;
# on CPU the faster step wins, so "int8" quantizes everything (docs/benchmarks.md, *Draft quantization*).
KEPT_FP32 = {"int8": (), "int8-down-fp32": ("down_proj",)}
DRAFT_QUANT = (*KEPT_FP32, "none")
