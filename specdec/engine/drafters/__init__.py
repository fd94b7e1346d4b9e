"""Drafters: one small interface (base.py) and what implements it: the draft model as a chain (draft_model.py)
or a tree (draft_tree.py), prompt lookup (prompt_lookup.py, lookup_tree.py), the repository index (repo.py over
repo_index.py and suffix_segment.py), their union as one tree (union_tree.py) and the composite `auto` picks
from (composite.py). Every draft is verified by the session as a tree (acceptance.verify_tree)."""
