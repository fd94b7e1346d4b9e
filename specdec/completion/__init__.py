"""The completion policy: what the code around the cursor says about a completion (single- or multi-line, where
generation stops, how the text is trimmed: syntax.py) and the bounded window of a document's text around the cursor
that a request carries (window.py). Shared by the language server, `specdec complete`, `specdec bench` and whoever
completes at a cursor; no editor protocol, no model, no torch."""
