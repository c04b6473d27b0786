"""The Hugging Face engine: transformers generate on a copy of the learner, its in-flight update emulation, and its
child-process worker (the async schedule's default on CPU)."""
