"""The evaluation settings a ``ggpo-train`` run trained with, read from its saved ``config.yaml``.

``ggpo eval RUN_DIR`` evaluates a run as it was trained: the prompt template, the chat template, the response
length and the verifier of its recipe, unless a flag says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggpo_lightning.records.errors import SettingsError

__all__ = ["RunSettings", "run_settings"]


@dataclass(frozen=True)
class RunSettings:
    """What ``ggpo eval`` takes from a run's recipe (``config.yaml``)."""

    config_path: Path
    template: str
    """``data.prompt_template``."""
    chat_template: Any
    """``model.chat_template`` (a bool, or the chat settings)."""
    max_new_tokens: int
    """``model.eval.max_new_tokens``, else ``model.rollout.sampling.max_new_tokens``: held-out accuracy's length."""
    verifier: str
    """``model.verifier`` as a ``--verifier`` spec (a registry name, or its JSON)."""
    verifier_timeout: float
    """``model.verifier_timeout``."""


def run_settings(source: str | Path) -> RunSettings | None:
    """The settings of the run directory ``source`` (its ``config.yaml``), or None when ``source`` is not a run
    directory with one (a model folder, a hub id, a checkpoint file).

    Raises:
        SettingsError: a ``config.yaml`` that is not a ggpo-train configuration (names the file and the key).
    """
    import yaml

    path = Path(source).expanduser() / "config.yaml"
    if not path.is_file() or (path.parent / "config.json").is_file():
        return None
    config = yaml.safe_load(path.read_text()) or {}
    model, data = config.get("model") or {}, config.get("data") or {}
    if not isinstance(model, dict) or "model_name_or_path" not in model:
        raise SettingsError(f"{path}: not a ggpo-train run configuration (no model.model_name_or_path); evaluate "
                            "its final_model/ folder, or pass the settings as flags")
    sampling = (model.get("rollout") or {}).get("sampling") or {}
    max_new_tokens = (model.get("eval") or {}).get("max_new_tokens") or sampling.get("max_new_tokens")
    if max_new_tokens is None:
        raise SettingsError(f"{path}: no model.eval.max_new_tokens or model.rollout.sampling.max_new_tokens; "
                            "pass --max-new-tokens")
    verifier = model.get("verifier", "math")
    return RunSettings(path, data.get("prompt_template") or "{prompt}", model.get("chat_template") or False,
                       int(max_new_tokens), verifier if isinstance(verifier, str) else json.dumps(verifier),
                       float(model.get("verifier_timeout") or 5.0))
