"""The transformers/torch backend (EngineConfig.backend "torch"): a checkpoint loaded by transformers
(loading.py), its running batch (batch.py) over a batched KV cache (kv_cache.py), a faster CPU path
for decode-sized products (cpu_linear.py), and the Executor the engine loop drives (executor.py)."""
