"""Drafters: one small interface (base.py), the draft model, prompt lookup, and their composite."""
