"""The behavior policy: the engine protocol and its one factory, the rollout settings, group rollouts, the sync and
async sources; each engine family in a folder of its own (``hf/``, ``vllm/``, ``fleet/``)."""
