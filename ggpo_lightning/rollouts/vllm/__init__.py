"""vLLM in the trainer process, and what it shares with the server fleet: the sampling requests, the replies read
into generations, and the layer-wise weight reload."""
