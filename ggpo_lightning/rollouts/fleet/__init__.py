"""Generation on vLLM servers: the HTTP engine, the servers' states, the weight push, the ``ggpo_gloo`` transfer
backend vLLM loads as a plugin, and the launcher of local servers."""
