"""Per-device memory of a training run, estimated from the model's ``config.json`` before any weight loads.

The estimate is a sum of parts, each a count times bytes (``P`` parameters, ``T`` trainable ones, ``W`` processes
sharing a sharded model, ``b`` bytes of a parameter under the precision):

- weights: ``P * b / W`` (``W`` = 1 unless sharded), plus under ``*-mixed`` autocast's half-precision copy of the
  weights it casts (``2 P`` bytes, kept for the forward; under FSDP2 one layer at a time: not counted);
- gradients: ``T * b / W``; optimizer state: ``s * T * b / W`` with ``s`` states per parameter (AdamW: 2);
- reference: a frozen copy, ``P * b / W`` (none with LoRA: the learner with its adapter off);
- activations of one micro-batch of ``N`` padded tokens: ``N * layers * c`` bytes kept for the backward, ``c`` the
  tensors a decoder layer saves per token (:func:`layer_bytes_per_token`); with gradient checkpointing only each
  layer's input is kept, plus one layer's tensors while it is recomputed; plus the output head's chunk of
  log-probs (``3 * chunk * V * 4`` bytes: logits, log-softmax and their gradient, in float32);
- the rollout engine: the HF engine (and vLLM on CPU) keeps its copy of the weights (``P * engine bytes``; none when
  it samples with the learner itself) and, while it generates, its KV cache (``2 * layers * kv_heads * head_dim *
  bytes`` per token of its batch); a colocated vLLM engine takes ``gpu_memory_utilization`` of the device while it
  generates and sleeps (weights offloaded, cache freed) while the learner trains; vLLM servers (``vllm_server``) hold
  nothing on the learner's devices, and a push to them takes, in the learner's thread between two updates, one full
  tensor at a time (the largest: the ``V * hidden`` embedding; gathered on every rank of a sharded learner, none of
  which keeps it: the gather's staging and its result in the learner's precision, its cast to the engine's dtype)
  and two packed buckets of :data:`PUSH_BUFFER_BYTES` (counted as the engine's part "while generating"; measured
  by ``benchmarks/push_memory.py``).

The engine generates and the learner runs its forward and backward at different times (in sync mode; in async
mode both parts add up), so

    total = weights + gradients + optimizer + reference + engine resident + max(activations, engine while generating)

A plain component: no Lightning, no weights (the parameter count comes from a model built on the ``meta`` device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PUSH_BUFFER_BYTES", "MemoryEstimate", "ModelShape", "available_host_memory", "estimate_memory",
           "layer_bytes_per_token", "model_shape", "precision_bytes"]

GB = 1e9

PUSH_BUFFER_BYTES = 128 << 20
"""One packed bucket of a push to vLLM servers (``ggpo_gloo``'s ``DEFAULT_BUCKET_BYTES``, vLLM's packed ``nccl`` as
the package sets it up); a push keeps two."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a decoder LM's configuration."""

    parameters: int
    """All parameters (tied embeddings counted once)."""
    lora_parameters: int
    """Parameters of the LoRA adapter on it (0 without LoRA)."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def model_shape(config: Any, lora_targets: list[str] | None = None, lora_rank: int = 0) -> ModelShape:
    """The :class:`ModelShape` of a transformers config (``AutoConfig``): the model built on the ``meta`` device (no
    memory, no weights) and its parameters counted, exactly as loading would make them; the LoRA adapter's are
    ``r * (in + out)`` for each linear layer whose name ends with one of ``lora_targets``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    adapter = sum(lora_rank * (m.in_features + m.out_features) for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and lora_targets
                  and any(name == t or name.endswith("." + t) for t in lora_targets))
    heads = config.num_attention_heads
    return ModelShape(parameters=sum(p.numel() for p in model.parameters()), lora_parameters=adapter,
                      layers=config.num_hidden_layers, hidden=config.hidden_size,
                      intermediate=config.intermediate_size, heads=heads,
                      kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                      head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                      vocab=config.vocab_size)


def available_host_memory() -> int | None:
    """The host's available memory in bytes (``MemAvailable`` of ``/proc/meminfo``); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            return 1024 * next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def precision_bytes(precision: Any) -> tuple[int, int, bool]:
    """``(parameter bytes, activation bytes, autocast)`` of a Lightning ``trainer.precision``: ``32-true`` (4, 4),
    ``bf16-mixed``/``16-mixed`` (4, 2, autocast), ``bf16-true``/``16-true`` (2, 2), ``64-true`` (8, 8)."""
    name = str(precision).lower()
    if name.startswith("64"):
        return 8, 8, False
    if name.startswith(("bf16", "16")):
        return (4, 2, True) if name.endswith("mixed") else (2, 2, False)
    return 4, 4, False


def layer_bytes_per_token(shape: ModelShape, activation_bytes: int, residual_bytes: int,
                          attention_row: int = 0) -> int:
    """Bytes one decoder layer (Llama/Qwen architecture) keeps per token for its backward.

    Per token: the residual stream and the two norms' inputs and outputs (``6 H``, in ``residual_bytes``: float32
    under autocast); query, key and value and their normed and rotated forms, the attention output and its
    contiguous copy (``5 Q + 4 KV``, ``Q = heads * head_dim``, ``KV = kv_heads * head_dim``); the MLP's gate, up,
    activated gate and product (``4 I``). ``attention_row``: the row length when attention keeps its probabilities
    (PyTorch's math attention, on CPU: ``heads * row`` per token, float32); 0 for fused kernels (flash, GPU)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return (6 * shape.hidden * residual_bytes + (5 * q + 4 * kv + 4 * shape.intermediate) * activation_bytes
            + shape.heads * attention_row * 4)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, by part (module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    micro_batch_tokens: int
    gradient_checkpointing: bool
    engine_resident: int
    engine_generating: int
    engine: str
    engine_overlaps: bool = False
    """The engine generates while the learner trains (async): its generating part adds to the activations."""
    device_memory: int | None = None
    device: str = ""

    @property
    def model_state(self) -> int:
        """What stays for the whole run: weights, gradients, optimizer state, reference, the engine's resident part."""
        return self.weights + self.gradients + self.optimizer + self.reference + self.engine_resident

    @property
    def total(self) -> int:
        if self.engine_overlaps:
            return self.model_state + self.activations + self.engine_generating
        return self.model_state + max(self.activations, self.engine_generating)

    def fits(self) -> bool:
        return self.device_memory is None or self.total <= self.device_memory

    def table(self) -> str:
        """A few lines, as ``ggpo-train`` prints them at start."""
        device = (f" of {self.device_memory / GB:.1f} GB ({self.device})" if self.device_memory is not None else "")
        rows = [("weights", self.weights, ""), ("gradients", self.gradients, ""),
                ("optimizer state", self.optimizer, ""), ("reference", self.reference, ""),
                ("activations", self.activations, f"per micro-batch of {self.micro_batch_tokens} tokens"),
                ("rollout engine", self.engine_resident + self.engine_generating,
                 f"{self.engine}: {self.engine_resident / GB:.2f} GB resident, "
                 f"{self.engine_generating / GB:.2f} GB while generating")]
        lines = ["memory per device (estimate, before the weights load):"]
        lines += [f"  {name:<16}{size / GB:8.2f} GB  {note}".rstrip() for name, size, note in rows]
        lines.append(f"  {'total':<16}{self.total / GB:8.2f} GB{device}")
        return "\n".join(lines)

    def advice(self) -> str:
        """The recipe key to change when the run does not fit: the part that alone could absorb the excess."""
        excess = self.total - (self.device_memory or 0)
        if self.activations >= self.engine_generating and self.activations >= excess:
            checkpointing = "" if self.gradient_checkpointing else ", or set model.gradient_checkpointing: true"
            return (f"lower model.micro_batch.max_tokens (activations {self.activations / GB:.2f} GB per micro-batch "
                    f"of {self.micro_batch_tokens} tokens){checkpointing}")
        if self.engine_generating >= excess:
            key = ("model.rollout.vllm_args.gpu_memory_utilization" if self.engine.startswith("vllm")
                   else "model.rollout.sampling.generation_batch_size")
            return f"lower {key} (the engine takes {self.engine_generating / GB:.2f} GB while generating)"
        return (f"the model state alone is {self.model_state / GB:.2f} GB: set trainer.precision bf16-true, shard it "
                "over more devices (trainer.strategy, trainer.devices), or train a model.lora adapter")


def estimate_memory(shape: ModelShape, *, precision: Any = "32-true", world_size: int = 1, sharded: bool = False,
                    lora: bool = False, optimizer_states: int = 2, gradient_checkpointing: bool = False,
                    micro_batch_tokens: int, logprob_chunk_size: int = 4096, attention_row: int = 0,
                    engine: str = "hf", engine_bytes: int | None = None, engine_shares_learner: bool = False,
                    engine_tokens: int = 0, vllm_memory: int | None = None, engine_overlaps: bool = False,
                    device_memory: int | None = None, device: str = "") -> MemoryEstimate:
    """The :class:`MemoryEstimate` of one device (formulas: the module docstring).

    Args:
        precision: ``trainer.precision``; the learner loads in float32 and Lightning casts it under ``*-true``.
        world_size, sharded: processes and whether the strategy shards weights, gradients and optimizer state
            (FSDP2) or replicates them (DDP, one device).
        lora: only the adapter trains; no reference copy.
        optimizer_states: tensors of optimizer state per trainable parameter (AdamW 2, SGD with momentum 1).
        micro_batch_tokens: padded tokens of the largest micro-batch (the whole step's without micro-batching).
        attention_row: row length when attention keeps its probabilities (CPU math attention); 0 on GPU.
        engine: the engine's name, as printed; ``vllm_server`` (servers of their own) takes nothing here.
        engine_bytes: bytes per parameter of the engine's copy of the weights (None: the learner's).
        engine_shares_learner: the HF engine samples with the learner itself (no copy).
        engine_tokens: tokens of one ``generate`` batch (sequences x (prompt + new tokens)): its KV cache.
        vllm_memory: a colocated vLLM engine's share of a GPU (``gpu_memory_utilization`` x the device), taken while
            it generates (asleep while the learner trains); None: the engine's copy and KV cache as for HF.
        engine_overlaps: the engine generates while the learner trains (async schedule): both parts add up.
        device_memory: the device's memory (GPU) or the host's available memory (CPU); None: not compared.
    """
    param_bytes, activation_bytes, autocast = precision_bytes(precision)
    shards = world_size if sharded else 1
    trainable = shape.lora_parameters if lora else shape.parameters
    residual_bytes = 4 if autocast else activation_bytes
    per_layer = layer_bytes_per_token(shape, activation_bytes, residual_bytes, attention_row)
    kept = shape.layers * shape.hidden * residual_bytes + per_layer if gradient_checkpointing \
        else shape.layers * per_layer  # checkpointed: each layer's input, and one layer recomputed at a time
    head = 3 * min(logprob_chunk_size, micro_batch_tokens) * shape.vocab * 4
    copy_bytes = param_bytes if engine_bytes is None else engine_bytes
    if engine == "vllm_server":  # on servers of their own; a push: the largest tensor gathered, two buckets packed
        resident = 0
        generating = shape.vocab * shape.hidden * (2 * param_bytes + copy_bytes) + 2 * PUSH_BUFFER_BYTES
    elif vllm_memory is not None:
        resident, generating = 0, vllm_memory
    else:
        resident = 0 if engine_shares_learner else shape.parameters * copy_bytes
        generating = engine_tokens * 2 * shape.layers * shape.kv_heads * shape.head_dim * copy_bytes  # K and V
    return MemoryEstimate(
        weights=shape.parameters * param_bytes // shards + (2 * shape.parameters if autocast and not sharded else 0),
        gradients=trainable * param_bytes // shards, optimizer=optimizer_states * trainable * param_bytes // shards,
        reference=0 if lora else shape.parameters * param_bytes // shards,
        activations=micro_batch_tokens * kept + head, micro_batch_tokens=micro_batch_tokens,
        gradient_checkpointing=gradient_checkpointing,
        engine_resident=resident, engine_generating=generating, engine=engine, engine_overlaps=engine_overlaps,
        device_memory=device_memory, device=device)
