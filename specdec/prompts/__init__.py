"""Prompts: FIM templates, the completion at a cursor, and languages."""
