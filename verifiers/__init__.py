"""ggpo_verifiers (in progress)."""
