"""The decode loop and everything a speculative step needs: acceptance, sampling, KV, drafters, strategies."""
