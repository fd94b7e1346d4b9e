"""Models: where weights come from (store, wheels, catalog), loading, quantization, adapters."""
