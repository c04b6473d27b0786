"""ggpo-lightning: off-policy RL for language models with verifiable rewards.

Gibbs-Gap Policy Optimization (GGPO) learns from responses of a stale, mismatched or
offline behavior policy without importance weights. Importing this package is cheap:
torch-heavy modules load only when their names are used.
"""

__version__ = "0.1.0.dev0"
