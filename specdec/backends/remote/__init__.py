"""Remote engines: completions computed by a shared llama-server, vLLM or SGLang (issue #43).

`http.py` speaks HTTP/1.1 to the engine (streamed, cancellable by closing the connection, bounded in time,
the API key sent and never echoed); `engines.py` holds each engine's request shape and how its stream and
speculation counters are read; `prompt.py` builds the FIM prompt (with repository context) an OpenAI-style
engine needs; `health.py` is the failure policy (one message per outage, bounded backoff, resumption);
`backend.py` puts them behind the `Backend` interface. Torch-free: the server imports this without a model.
"""

KINDS = ("llama-server", "vllm", "sglang")
API_KEY_ENV = "SPECDEC_ENGINE_API_KEY"
