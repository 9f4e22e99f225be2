"""The llama.cpp backend (EngineConfig.backend "llamacpp"): a GGUF model run by llama.cpp's kernels
(model.py), its context and KV cache layout (context.py), which seq_id each sequence holds and the
prefix cache (rows.py), and the Executor the engine loop drives (executor.py). Imports no torch."""
