"""The fine-tune's file filter is specdec's own (specdec/repository/files.py): training and the repository index
read a repository through the one filter. Re-exported for callers of `specdec_finetune.files`."""

from specdec.repository.files import (  # noqa: F401
    ENTROPY_BITS, GENERATED_MARKERS, LOCK_FILES, MAX_BYTES, SECRET_NAMES, SECRET_PATTERNS, VENDORED_DIRS,
    FileSelection, list_files, secret_reason, select, shannon_entropy,
)
