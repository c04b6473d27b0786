"""LoRA adapters for the learner: wrap, reference with the adapter off, refresh by merging, export.

With ``model.lora`` set, the learner is the base model plus a LoRA adapter (``peft``):
each targeted linear layer computes ``W x + s * B A x`` with ``s = alpha / r``, and only
``A`` and ``B`` are trained. The base ``W`` is frozen, which gives the frozen reference
for free:

- **reference** = the same model with the adapter disabled (``log pi_ref = log pi_W``):
  no second copy of the weights, so the module holds about 1x the base, not 2x;
- **reference refresh** (``docs/METHOD.md#reference-refresh``) = merge the adapter into the base in place,
  ``W <- W + s * B A``, and start a fresh adapter (``A`` re-drawn, ``B = 0``). Right after
  it the learner equals the new reference exactly and the KL term restarts from zero,
  as a refresh does in full fine-tuning;
- **rollout sync** = the merged weights ``W + s * B A``, computed without touching the
  learner, as a plain ``state_dict`` for the engine's plain model.

Memory: the module holds the base once plus the adapter (and the adapter's gradients
and optimizer state); the rollout engine keeps its own plain copy, as in full fine-tuning
(in ``rollout.dtype``, e.g. bf16). Checkpoints hold the whole learner, base included,
because refreshes change the base in memory; the base on disk is checked by path and
fingerprint on resume. Exports: ``final_adapter/`` (peft; with the merged base in
``base/`` once a refresh changed it) and, on request, ``final_model/`` (merged).

``peft`` is an optional dependency (``pip install 'ggpo-lightning[lora]'``), imported only
when LoRA is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ggpo_lightning.records.extras import require

__all__ = ["LoraSettings", "adapter_disabled", "base_fingerprint", "check_target_modules", "lora_layers",
           "merge_and_reset", "plain_state_dict", "save_adapter", "wrap"]

ADAPTER = "default"  # peft's name of the one adapter the learner carries


@dataclass
class LoraSettings:
    """A LoRA adapter on the learner (``peft``): only the adapter is trained."""

    r: int = 16
    """Rank of each adapter ``B A`` (>= 1)."""
    alpha: float = 32.0
    """Scale numerator: the adapter adds ``(alpha / r) * B A`` to each targeted weight."""
    dropout: float = 0.0
    """Dropout on the adapter's input, in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names (or name suffixes) of the linear layers that get an adapter."""
    export_merged: bool = False
    """Also export the merged model (base + adapter, plain transformers) as ``final_model/``."""

    def errors(self) -> list[str]:
        """Configuration errors, each naming its key (``model.lora.*``)."""
        errors = []
        if self.r < 1:
            errors.append(f"model.lora.r must be >= 1, got {self.r}")
        if not self.alpha > 0:
            errors.append(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            errors.append(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            errors.append("model.lora.target_modules must name at least one module")
        return errors


def _require_peft():
    require("peft", "model.lora (remove the section to train all weights)")
    import peft

    return peft


def check_target_modules(model: nn.Module, targets: list[str]) -> None:
    """Every target must match a module (by full name or name suffix, as peft matches).

    Raises:
        ValueError: naming the targets that match nothing and the layer names the model has.
    """
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        found = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if isinstance(m, (nn.Linear, nn.Embedding))})
        raise ValueError(f"model.lora.target_modules {missing} match no module of the model; its linear and "
                         f"embedding layers are named: {', '.join(found)}")


def wrap(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """``model`` with a fresh LoRA adapter (a ``peft`` model): base frozen, adapter trainable.

    The base model's modules are changed in place (peft injects the adapter layers).
    """
    peft = _require_peft()
    check_target_modules(model, settings.target_modules)
    config = peft.LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                             target_modules=list(settings.target_modules), task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def lora_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(name, layer)`` of each adapter-carrying layer of a wrapped model."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """The base model (the reference): adapter off, eval mode (no dropout); both restored on exit."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def merge_and_reset(model: nn.Module) -> None:
    """Refresh by merging: ``W <- W + s * B A`` in place, then a fresh adapter (``A`` re-drawn, ``B = 0``).

    The adapter's parameter tensors are re-initialized in place, so an optimizer built over
    them stays valid (its state should be reset: see ``GGPOModule.refresh_reference``).
    Afterwards the learner equals its base exactly (``B = 0`` adds exact zeros).
    """
    for _, layer in lora_layers(model):
        base = layer.get_base_layer()
        base.weight.add_(layer.get_delta_weight(ADAPTER).to(base.weight.dtype))
        layer.reset_lora_parameters(ADAPTER, init_lora_weights=True)


@torch.no_grad()
def plain_state_dict(model: nn.Module, merged: bool) -> dict[str, Tensor]:
    """The wrapped model's weights under the plain model's keys, without changing the model.

    ``merged=True``: ``W + s * B A`` (the learner); ``merged=False``: ``W`` (the base, the
    reference). Loadable into the unwrapped architecture (``load_state_dict``,
    ``save_pretrained(state_dict=...)``).
    """
    inner = model.get_base_model()
    deltas = {f"{name}.base_layer.weight": layer.get_delta_weight(ADAPTER)
              for name, layer in lora_layers(inner)} if merged else {}
    state = {}
    for key, value in inner.state_dict().items():
        if ".lora_" in key:  # lora_A / lora_B / lora_embedding_*: the adapter itself
            continue
        if key in deltas:
            value = value + deltas[key].to(value.dtype)
        state[key.replace(".base_layer.", ".")] = value
    return state


def save_adapter(model: nn.Module, directory: Path, base_model_name_or_path: str) -> None:
    """The adapter as ``peft`` saves it (loadable with ``PeftModel.from_pretrained(base, directory)``).

    ``adapter_config.json`` records ``base_model_name_or_path``: the base the adapter
    applies to (after refreshes, the merged base exported next to it, not the original), and the settings that peft
    keeps as sets (``target_modules``) sorted: peft writes a set in the order of this process's string hashing, which
    would give the same adapter another file, and another checksum, at every run.
    """
    model.save_pretrained(directory)
    config_path = directory / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base_model_name_or_path
    for key, value in vars(model.peft_config[ADAPTER]).items():
        if isinstance(value, set):
            config[key] = sorted(config[key])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def base_fingerprint(model: nn.Module) -> str:
    """A short hash of a freshly loaded base model: its parameter names and shapes, and its input embedding's values.

    Two bases with the same architecture but other weights (a base and its instruct
    version) differ here; a moved or renamed folder of the same base does not, nor do
    settings outside the weights (gradient checkpointing, the transformers version).
    """
    shapes = [(name, list(value.shape)) for name, value in model.state_dict().items()]
    digest = hashlib.sha256(json.dumps(shapes).encode())
    embedding = model.get_input_embeddings().weight.detach().to("cpu", torch.float64)
    digest.update(f"{embedding.sum().item():.10e} {embedding.abs().sum().item():.10e}".encode())
    return digest.hexdigest()[:16]
