"""The module's settings checked together, before any model loads: every error at once, each naming its recipe key."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ggpo_lightning.core.microbatch import MicroBatchConfig
from ggpo_lightning.core.objectives import ObjectiveConfig, get_objective
from ggpo_lightning.core.schedule import LRScheduleConfig
from ggpo_lightning.evaluation.accuracy import EvalConfig
from ggpo_lightning.models.compiled import compile_errors
from ggpo_lightning.models.lora import LoraSettings
from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.training.verifier_health import VerifierHealthConfig

__all__ = ["build_config", "check_model_settings", "check_settings", "run_settings"]


def check_settings(objective: ObjectiveConfig, rollout: RolloutConfig, evaluation: EvalConfig,
                   verifier: str | dict, verifier_timeout: float, health: VerifierHealthConfig,
                   ref_refresh_every: int, max_nan_steps: int, lora: LoraSettings | None,
                   micro_batch: MicroBatchConfig, lr_schedule: LRScheduleConfig | None, compile: bool = False) -> None:
    """Raise one SettingsError listing every invalid setting (the configs' own ``errors()`` and the module's)."""
    from ggpo_verifiers import verifier_class

    errors = objective.errors() + rollout.errors() + evaluation.errors() + (lora.errors() if lora else [])
    errors += health.errors() + micro_batch.errors() + (lr_schedule.errors() if lr_schedule else [])
    errors += compile_errors(compile, sharded=False)  # the strategy is the trainer's: checked by the preflight
    name = verifier if isinstance(verifier, str) else verifier.get("class_path") if isinstance(verifier, dict) else None
    if name is not None:
        try:  # a registered name, an entry point or a class path, as get_verifier accepts
            verifier_class(name)
        except (ImportError, AttributeError, TypeError, ValueError, LookupError) as exc:
            errors.append(f"model.verifier: {exc}")
    if not verifier_timeout > 0:
        errors.append(f"model.verifier_timeout must be > 0 seconds, got {verifier_timeout}")
    if ref_refresh_every < 0:
        errors.append(f"model.ref_refresh_every must be >= 0 (0 = never), got {ref_refresh_every}")
    if max_nan_steps < 1:
        errors.append(f"model.max_nan_steps must be >= 1, got {max_nan_steps}")
    if rollout.engine == "vllm_server" and not rollout.server_logprobs and _uses_behavior_logp(objective.name):
        errors.append(f"model.rollout.server_logprobs: false leaves {objective.name} without the behavior log-probs "
                      "it reads; keep it true, or use an objective without them (ggpo)")
    if errors:
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(errors))


def _uses_behavior_logp(name: str) -> bool:
    try:
        return get_objective(name).uses_behavior_logp
    except ValueError:  # an unknown name: ObjectiveConfig.errors() says so
        return False


def check_model_settings(model: dict[str, Any]) -> None:
    """:func:`check_settings` on a parsed recipe's ``model`` group (a plain dict, as ``--print_config`` has it,
    before any class is built): the values the module would refuse, refused without loading anything."""
    lora = model.get("lora")
    check_settings(build_config(ObjectiveConfig, model.get("objective")), build_config(RolloutConfig, model.get("rollout")),
                   build_config(EvalConfig, model.get("eval")), model.get("verifier", "math"),
                   model.get("verifier_timeout", 5.0), build_config(VerifierHealthConfig, model.get("verifier_health")),
                   model.get("ref_refresh_every", 160), model.get("max_nan_steps", 10),
                   build_config(LoraSettings, lora) if lora else None, build_config(MicroBatchConfig, model.get("micro_batch")),
                   build_config(LRScheduleConfig, model["lr_scheduler"]) if model.get("lr_scheduler") else None,
                   bool(model.get("compile", False)))


def build_config(cls: type, value: Any) -> Any:
    """The dataclass ``cls`` from its parsed dict (None = its defaults), nested dataclass fields built too."""
    if value is None or dataclasses.is_dataclass(value):
        return value or cls()
    hints = typing.get_type_hints(cls)
    fields = {}
    for name, item in value.items():
        nested = [t for t in (hints.get(name), *typing.get_args(hints.get(name))) if dataclasses.is_dataclass(t)]
        fields[name] = build_config(nested[0], item) if nested and isinstance(item, dict) else item
    return cls(**fields)


def run_settings(objective: ObjectiveConfig, rollout: RolloutConfig, model_name_or_path: str,
                 prompts_per_step: int | None) -> dict[str, object]:
    """The settings that define a run, by recipe key: what a resume must match (the checkpoint's fingerprint,
    :func:`~ggpo_lightning.models.checkpoint.run_fingerprint`)."""
    return {"model.objective.name": objective.name, "model.objective.beta": objective.beta,
            "model.rollout.k": rollout.k, "model.rollout.sync_every": rollout.sync_every,
            "model.rollout.schedule": rollout.schedule,
            "model.model_name_or_path": model_name_or_path, "data.prompts_per_step": prompts_per_step}
