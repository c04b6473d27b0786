"""``python -m ggpo_verifiers``: the ``ggpo verifiers`` command group on its own."""

from ggpo_verifiers.cli import verifiers_group

if __name__ == "__main__":
    verifiers_group(prog_name="python -m ggpo_verifiers")
