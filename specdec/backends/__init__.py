"""Backends: where a completion is computed, behind one interface (`base.Backend`).

The server, `specdec complete` and the benchmarks hand a backend a serialisable `CompletionRequest` and get a
`CompletionResult` back; `make_backend(settings)` picks the backend by kind (vLLM's `EngineCoreClient.make_client`
is the model). `local` runs specdec's engine in this process; `llama_server` is the llama.cpp HTTP client;
`remote/`: a shared llama-server, vLLM or SGLang (issue #43), whose results have the CompletionResult shape.
"""

from specdec.backends.base import KINDS, Backend, CompletionRequest, CompletionResult, make_backend

__all__ = ["KINDS", "Backend", "CompletionRequest", "CompletionResult", "make_backend"]
