"""Backends: where a completion is computed. `remote/`: a shared llama-server, vLLM or SGLang (issue #43)."""
