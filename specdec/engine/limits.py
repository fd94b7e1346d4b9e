"""Bounds on what a caller may ask of the engine, in one torch-free place (the CLI and the server's
settings validate against them before anything heavy is imported).

Per-step work must never grow with a setting's value, and an int4 target's verify passes
(MAX_DRAFT + 1 rows) must stay on its row-independent kernel (specdec/models/int4.py).
"""

MAX_DRAFT = 32  # drafted tokens per target pass
MAX_NEW_TOKENS = 1024  # tokens per completion: a completion, not a document
REPO_INDEX_MAX_TOKENS = 16_000_000  # token ids a repository index stores by default (~8 bytes each at rest)
REPO_INDEX_TOKENS_LIMIT = 256_000_000  # the most one may ask for: its segments' positions stay int32
