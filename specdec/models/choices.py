"""What a user chooses for the models, importable without torch (the CLI and the server's settings
validate against these before anything heavy loads)."""

from specdec.hardware import DTYPES  # noqa: F401 (one of the choices; hardware resolves it, so it is defined there)

# The target's weights: int4 = the GGUF's Q4_K codes as they are (specdec.models.int4), int8 = every
# Linear int8 per channel, none = the dequantized float weights. Lossless in every mode: the
# drafts are checked against whatever target runs. auto (the default) = int4 where the target was made
# from a GGUF and runs on CPU, else none (specdec.models.quantize.resolve_target_quant).
TARGET_MODES = ("none", "int4", "int8")
TARGET_QUANT = ("auto", *TARGET_MODES)
# The int4 target's matmul kernel: aten = PyTorch's int4 CPU kernel (bf16 activations); w4a8 = specdec's
# AVX512-VNNI/AVX2 kernel (int8 activations; a verify pass's rows cost far less each), compiled once per
# machine; auto = w4a8 where it builds and runs, else aten (specdec.models.int4, specdec.models.w4a8).
INT4_KERNELS = ("auto", "w4a8", "aten")
# Linear layers each int8 mode leaves in fp32. Qwen2's MLP output projection sees activation
# outliers (a few channels far larger than the rest) that per-token int8 activations still
# round coarsely. Keeping down_proj fp32 buys a little agreement for a clearly slower draft step;
# on CPU the faster step wins, so "int8" quantizes everything (docs/benchmarks.md, *Draft quantization*).
KEPT_FP32 = {"int8": (), "int8-down-fp32": ("down_proj",)}
DRAFT_QUANT = (*KEPT_FP32, "none")
# The target's forward: native = specdec's own (specdec.native: Qwen2/Llama GGUFs on CPU, read straight from the
# GGUF, bit-exact speculation), transformers = today's path; auto = native where it can run (a qwen2/llama GGUF on
# CPU, W4A8 and the native ops available here, targetQuant auto or int4), else transformers.
FORWARDS = ("auto", "native", "transformers")
# The draft's Linear layers a LoRA adapter may cover: the ones the server can switch per workspace
# (specdec.models.lora.TARGET_MODULES)
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
