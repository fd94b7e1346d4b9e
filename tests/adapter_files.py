"""Adapter folders and archives for tests: random, spoiled, packed."""

import tarfile
from pathlib import Path


import tiny


def random_adapter(path, seed: int, **lora):
    """A saved LoRA adapter for tiny.model(seed=2) whose B is not zero, so it changes the logits."""
    import torch
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(tiny.model(seed=2), LoraConfig(r=4, target_modules=["q_proj", "down_proj"], **lora))
    torch.manual_seed(seed)
    for pname, param in peft_model.named_parameters():
        if "lora_B" in pname:
            torch.nn.init.normal_(param, std=0.3)
    peft_model.save_pretrained(path)
    return path


def spoil(adapter: Path, how: str) -> Path:
    """Issue #30.13's broken weights: garbage bytes, a factor of the wrong shape, NaN values; issue #40.13's
    finite but huge ones (every factor 1e30: the update overflows fp32)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights_file = adapter / "adapter_model.safetensors"
    if how == "garbage":
        weights_file.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" + bytes(range(256)) * 8)
        return adapter
    weights = load_file(weights_file)
    key = sorted(k for k in weights if "lora_A" in k)[0]
    if how == "shape":
        weights[key] = torch.zeros(weights[key].shape[0] + 1, weights[key].shape[1])
    elif how == "huge":
        weights = {k: torch.full_like(v, 1e30) for k, v in weights.items()}
    else:
        weights[key][0, 0] = float("nan")
    save_file(weights, weights_file)
    return adapter


def tar_gz(path: Path, members: list[tuple[str, bytes]], link: str | None = None) -> Path:
    import io

    with tarfile.open(path, "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tf.addfile(info)
    return path
