"""The online refresh's job: what the language server (lsp_server/online.py) sends the trainer
(`python -m specdec_finetune.online`, finetune/online.py) on its stdin, as JSON. One definition both sides use:
the server builds it, the trainer parses it. Torch-free, as the server imports it before any model loads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from specdec.errors import SpecdecError
from specdec.models.choices import FORWARDS


@dataclass
class AcceptedSample:
    """An accepted completion: its context and the token ids the target generated (the training labels)."""

    path: str
    language: str
    prefix: str
    suffix: str
    tokens: list[int]
    text: str  # the suggestion as shown


@dataclass
class OnlineJob:
    """`accepted`: oldest first, each an AcceptedSample as a dict (`text`: the suggestion as the user took it);
    `edited`: each {path, language, text}. Paths are relative to the workspace."""

    workspace: str
    draft: str
    target: str
    draft_hash: str = ""  # the server's base draft: the adapter must fit what it serves
    dtype: str = "auto"
    draft_quant: str = "int8"
    fim_family: str = ""
    steps: int = 8
    batch_size: int = 2
    seq_len: int = 256
    learning_rate: float = 3e-4
    seed: int = 0
    accepted: list[dict] = field(default_factory=list)
    edited: list[dict] = field(default_factory=list)
    fresh: int = -1  # the newest `fresh` accepted completions were never trained on (-1: all of them)
    forward: str = "auto"  # the server's `forward` setting: where the target labels (native: from its GGUF's
    # codes, as the server verifies; specdec.native.loading.choose)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, data) -> OnlineJob:
        if not isinstance(data, dict):
            raise SpecdecError("online job: expected a JSON object")
        known = set(cls.__dataclass_fields__)
        try:
            job = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise SpecdecError(f"online job: {exc}") from None
        names = ("workspace", "draft", "target", "draft_hash", "dtype", "draft_quant", "fim_family", "forward")
        if not all(isinstance(getattr(job, name), str) for name in names):
            raise SpecdecError(f"online job: {', '.join(names)} must be strings")
        if not all(isinstance(s, dict) and isinstance(s.get("tokens"), list) for s in job.accepted):
            raise SpecdecError("online job: every accepted completion needs its token ids")
        if not all(isinstance(d, dict) and isinstance(d.get("path"), str) and isinstance(d.get("text"), str)
                   for d in job.edited):
            raise SpecdecError("online job: every edited document needs its path and text")
        if job.forward not in FORWARDS:
            raise SpecdecError(f"online job: forward must be one of {', '.join(FORWARDS)}, not {job.forward!r}")
        if job.steps < 1 or job.batch_size < 1 or job.seq_len < 32:
            raise SpecdecError("online job: steps and batch size must be >= 1, seq_len >= 32")
        return job
