"""The recipes folder, importable as ``ggpo_lightning.recipes``: a wheel install carries the YAML files, which
``ggpo recipes list`` shows and ``ggpo recipes copy`` copies out (``ggpo_lightning/cli/recipes.py``)."""
