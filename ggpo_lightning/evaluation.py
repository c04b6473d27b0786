"""Benchmark evaluation of a causal LM with a verifier: pass@k, avg@k and accuracy.

For each problem the model draws ``k`` responses (greedy when ``k == 1`` and
``temperature == 0``, else sampled); the verifier scores them, and a response is
*correct* when it scores 1.0 (partial credit counts as wrong). With ``c`` of the ``n``
responses of a problem correct:

- ``pass@k = 1 - C(n - c, k) / C(n, k)``, the unbiased estimate of the chance that at
  least one of ``k`` responses is correct (Chen et al. 2021, "Evaluating Large Language
  Models Trained on Code");
- ``avg@k = c / k``, the mean correctness of the ``k`` responses;
- ``accuracy`` = pass@1 = ``c / n``: the greedy accuracy when ``k == 1`` and
  ``temperature == 0``, else the mean over the samples.

Here ``n == k``, so ``accuracy`` equals ``avg@k`` and ``pass@k`` is 1 for a problem with
any correct response. Every metric of a benchmark is the mean over its problems.

The model comes from a model folder (``save_pretrained``), a ``ggpo-train`` run
directory (its ``final_model/``) or a run's Lightning ``.ckpt`` (see :func:`load_model`);
the ``ggpo eval`` command (``ggpo_lightning.eval_cli``) wraps it all.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ggpo_lightning.data import PromptRow, read_records
from ggpo_lightning.models import load_causal_lm, load_tokenizer
from ggpo_lightning.rollout import encode_prompt, generate_responses
from ggpo_verifiers import GoldAnswerError, Verifier
from ggpo_verifiers.extract import last_boxed

__all__ = ["EvalResult", "avg_at_k", "check_settings", "evaluate_model", "load_benchmark", "load_model",
           "pass_at_k", "validate_golds"]

PROMPT_FIELDS = ("problem", "question", "prompt")
"""Prompt fields tried in this order when ``prompt_field`` is not given."""
ANSWER_FIELDS = ("answer", "solution")
"""Answer fields tried in this order when ``answer_field`` is not given."""
BOXED_FIELDS = ("solution",)
"""Answer fields holding a worked solution: the gold is its last ``\\boxed{...}``."""


# ----------------------------------------------------------------------------- metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct of ``n`` samples: ``1 - C(n - c, k) / C(n, k)``.

    Computed as the product ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (the same
    ratio, without huge binomials), and 1 when ``n - c < k`` (every ``k``-subset holds
    a correct sample).
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(c: int, k: int) -> float:
    """Mean correctness of ``k`` samples of which ``c`` are correct: ``c / k``."""
    if not (0 <= c <= k and k >= 1):
        raise ValueError(f"avg_at_k needs 0 <= c <= k and k >= 1, got c={c}, k={k}")
    return c / k


# ----------------------------------------------------------------------------- benchmarks


def _detect(found: dict[str, Any], given: str | None, candidates: Sequence[str]) -> str | None:
    if given is not None:
        return given
    return next((name for name in candidates if name in found), None)


def load_benchmark(path: str | Path, prompt_field: str | None = None, answer_field: str | None = None,
                   limit: int | None = None) -> list[PromptRow]:
    """Problems and gold answers of a JSONL or Parquet benchmark file.

    The layout is detected on the first record: the prompt is the first of
    ``problem``, ``question``, ``prompt`` it has, the gold the first of ``answer``,
    ``solution`` (so ``problem``/``answer``, ``question``/``answer`` and
    ``prompt``/``solution`` files load as they are); ``prompt_field`` /
    ``answer_field`` override either half. From a ``solution`` field the gold is the
    solution's last ``\\boxed{...}``; any other field is the gold as it is. Ids come
    from an ``id`` field, else ``file:line``. ``limit`` keeps the first N problems.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the layout is unknown (lists the fields found and the flags
            ``--prompt-field`` / ``--answer-field``), a record lacks a field, a
            solution has no box, or the file has no records (each names ``file:line``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    rows: list[PromptRow] = []
    fields: tuple[str, str] | None = None
    for number, record in read_records(path):
        where = f"{path}:{number}"
        if fields is None:
            prompt, answer = _detect(record, prompt_field, PROMPT_FIELDS), _detect(record, answer_field, ANSWER_FIELDS)
            if prompt is None or answer is None:
                raise ValueError(
                    f"{where}: unknown benchmark layout (fields: {', '.join(sorted(record))}); expected a prompt "
                    f"field ({', '.join(PROMPT_FIELDS)}) and an answer field ({', '.join(ANSWER_FIELDS)}); map "
                    f"yours with --prompt-field and --answer-field")
            fields = (prompt, answer)
        for name, flag in zip(fields, ("--prompt-field", "--answer-field")):
            if record.get(name) is None:
                raise ValueError(f"{where}: missing field {name!r} (fields: {', '.join(sorted(record))}); "
                                 f"choose another with {flag}")
        gold = str(record[fields[1]])
        if fields[1] in BOXED_FIELDS:
            boxed = last_boxed(gold)
            if boxed is None:
                raise ValueError(f"{where}: field {fields[1]!r} has no \\boxed{{...}} answer to take as the gold; "
                                 f"name a field with the bare answer with --answer-field")
            gold = boxed
        row_id = str(record["id"]) if record.get("id") is not None else f"{path.name}:{number}"
        rows.append(PromptRow(row_id, str(record[fields[0]]), gold, where))
        if len(rows) == limit:
            break
    if not rows:
        raise ValueError(f"{path}: no problems found")
    return rows


def validate_golds(rows: Sequence[PromptRow], verifier: Verifier) -> None:
    """Raise ValueError naming ``file:line`` of the first gold answer ``verifier`` cannot use."""
    try:
        verifier.validate_golds([r.gold for r in rows])
    except GoldAnswerError as exc:
        row = rows[exc.index]
        raise ValueError(f"{row.source}: {exc} (problem id {row.id!r}); fix or drop the row") from exc


# ----------------------------------------------------------------------------- models


def load_model(source: str | Path, base_model: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in eval mode, on CPU) and tokenizer to evaluate.

    ``source`` is one of:

    - a model folder (``save_pretrained``, has ``config.json``) or a hub id;
    - a peft adapter folder (``adapter_config.json``), merged into the base it names;
    - a ``ggpo-train`` run directory: its exported ``final_model/``, or a LoRA run's
      ``final_adapter/`` when it exported no merged model;
    - a run's Lightning checkpoint (``.ckpt``; a file, or under FSDP2 a sharded folder,
      consolidated in memory): its ``state_dict`` entries
      ``learner.*`` are the learner's weights, loaded into ``base_model`` (the run's
      ``model.model_name_or_path``, recorded in the checkpoint; ``base_model``
      overrides it, e.g. when the run used a relative path), which gives the
      architecture and tokenizer. A LoRA run's checkpoint is loaded as base plus adapter
      and merged.

    Raises:
        ValueError: a checkpoint that records no base model and no ``base_model``, or without learner weights, or
            whose weights do not fit ``base_model``; ``base_model`` with another source;
            a directory that is neither a model folder nor a run directory.
        FileNotFoundError, OSError: as :func:`~ggpo_lightning.models.load_causal_lm`.
    """
    path = Path(source).expanduser()
    if path.suffix == ".ckpt":
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        return _load_checkpoint(path, base_model)
    if base_model is not None:
        raise ValueError(f"--base-model is for .ckpt sources only; {source} is not a .ckpt file")
    if path.is_file():
        raise ValueError(f"{path} is a file but not a .ckpt checkpoint; give a model folder, a run directory "
                         f"or a .ckpt file")
    if (path / "adapter_config.json").is_file():
        return _load_adapter(path)
    if path.is_dir() and not (path / "config.json").is_file():
        if (path / "final_adapter").is_dir() and not (path / "final_model").is_dir():
            return _load_adapter(path / "final_adapter")  # a LoRA run exported without the merged model
        if not (path / "final_model").is_dir():
            checkpoints = sorted(str(p) for p in path.glob("checkpoints/*.ckpt"))
            hint = (f"; evaluate a checkpoint instead: {', '.join(checkpoints)} (with --base-model)"
                    if checkpoints else "")
            raise ValueError(f"{path} is neither a model folder (no config.json) nor a run directory with an "
                             f"exported final_model/{hint}")
        path = path / "final_model"
    name = path if path.exists() else str(source)  # not a path: a hub id
    return load_causal_lm(name, dtype="auto").eval(), load_tokenizer(name)


def _load_adapter(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A peft adapter folder: its base (``base_model_name_or_path`` in ``adapter_config.json``), adapter merged."""
    from peft import PeftModel

    base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = PeftModel.from_pretrained(load_causal_lm(base, dtype="auto"), path).merge_and_unload()
    return model.eval(), load_tokenizer(path)


def _read_checkpoint(path: Path) -> dict:
    """A Lightning checkpoint file, or a sharded one (a folder of ``torch.distributed.checkpoint`` shards and
    Lightning's ``meta.pt``) consolidated into one dict in memory."""
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not (path / "meta.pt").is_file() or not (path / ".metadata").is_file():
        raise ValueError(f"{path} is a folder but not a sharded checkpoint (no .metadata and meta.pt)")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(path, Path(tmp) / "full.pt")
        checkpoint = torch.load(Path(tmp) / "full.pt", map_location="cpu", weights_only=True)
    return {**checkpoint, **torch.load(path / "meta.pt", map_location="cpu", weights_only=True)}


def _load_checkpoint(path: Path, base_model: str | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    checkpoint = _read_checkpoint(path)
    base_model = base_model or checkpoint.get("ggpo", {}).get("model_name_or_path")
    if base_model is None:
        raise ValueError(f"{path}: the checkpoint does not record its base model; pass --base-model with the "
                         f"run's model.model_name_or_path (in config.yaml of the run directory)")
    weights = {key.removeprefix("learner."): value for key, value in checkpoint.get("state_dict", {}).items()
               if key.startswith("learner.")}
    if not weights:
        raise ValueError(f"{path}: its state_dict has no learner.* weights; is it a ggpo-train checkpoint?")
    model = load_causal_lm(base_model, dtype=next(iter(weights.values())).dtype)
    lora = checkpoint.get("ggpo", {}).get("lora")
    if lora is not None:  # base (refreshes merged in) + adapter: wrap as in training, load, merge
        from ggpo_lightning.lora import LoraSettings, wrap

        model = wrap(model, LoraSettings(**lora["settings"]))
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ValueError(f"{path}: the learner weights do not fit base model {base_model}: {exc}") from None
    if lora is not None:
        model = model.merge_and_unload()
    return model.eval(), load_tokenizer(base_model)


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class EvalResult:
    """Per-problem correct counts of ``k`` responses each, and the benchmark's mean metrics."""

    k: int
    ids: list[str]
    correct: list[int]
    """Correct responses (of ``k``) per problem, in the order of ``ids``."""

    @property
    def metrics(self) -> dict[str, float]:
        """``accuracy`` (pass@1), ``avg@k`` and ``pass@k``, each the mean over the problems."""
        n = len(self.correct)
        return {"accuracy": sum(pass_at_k(self.k, c, 1) for c in self.correct) / n,
                "avg@k": sum(avg_at_k(c, self.k) for c in self.correct) / n,
                "pass@k": sum(pass_at_k(self.k, c, self.k) for c in self.correct) / n}

    def to_dict(self) -> dict[str, Any]:
        """``problems``, ``k``, the metrics, and ``per_problem``: ``[{"id", "correct"}, ...]``."""
        return {"problems": len(self.ids), "k": self.k, **self.metrics,
                "per_problem": [{"id": i, "correct": c} for i, c in zip(self.ids, self.correct)]}


def check_settings(k: int, temperature: float, top_p: float, template: str = "{prompt}") -> None:
    """ValueError naming the flag, for decoding settings out of range (or ``k > 1`` greedy
    draws, which would be identical) and for a ``template`` that does not format."""
    if k < 1:
        raise ValueError(f"--k must be >= 1, got {k}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if k > 1 and temperature == 0:
        raise ValueError(f"--k {k} with --temperature 0 would draw {k} identical greedy responses; "
                         f"set --temperature > 0, or --k 1")
    if not 0 < top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")
    _apply_template(template, "")


def _apply_template(template: str, prompt: str) -> str:
    try:
        return template.format(prompt=prompt)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"--template {template!r}: cannot format it ({type(exc).__name__}: {exc}); it may name "
                         f"only {{prompt}}, and literal braces are written {{{{ and }}}}") from None


@torch.no_grad()
def evaluate_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[PromptRow],
                   verifier: Verifier, k: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                   max_new_tokens: int = 512, batch_size: int = 64, seed: int = 0, template: str = "{prompt}",
                   chat_template: bool = False) -> EvalResult:
    """Draw ``k`` responses per problem, score them with ``verifier``, count the correct ones.

    Prompts are ``template.format(prompt=row.prompt)``, wrapped as a user turn of the
    tokenizer's chat template when ``chat_template``. ``k == 1`` with ``temperature == 0``
    decodes greedily; otherwise samples at ``temperature`` with nucleus ``top_p`` (no
    top-k cut). ``batch_size`` is sequences per ``generate`` call. Sampling uses a
    forked RNG seeded with ``seed``: the result is a function of the seed (on one
    device and batch size), and torch's global RNG state is left as it was. The gold
    answers should pass :func:`validate_golds` first (the verifier scores a bad gold 0).
    """
    check_settings(k, temperature, top_p, template)
    if not rows:
        raise ValueError("evaluate_model needs at least one problem")
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat-template is set but the tokenizer has no chat template; use --no-chat-template "
                         "or an instruction-tuned model")
    decoding: dict[str, Any] = {"do_sample": False}
    if temperature > 0:
        decoding = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    prompts = [encode_prompt(tokenizer, _apply_template(template, r.prompt), chat_template) for r in rows]
    flat = [p for p in prompts for _ in range(k)]  # problem i's samples at rows i*k .. i*k+k-1
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    responses: list[list[int]] = []
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for start in range(0, len(flat), batch_size):
                responses.extend(generate_responses(model, tokenizer, flat[start:start + batch_size], max_new_tokens,
                                                    **decoding))
    finally:
        model.train(was_training)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    scores = verifier.score_batch(texts, [r.gold for r in rows for _ in range(k)])
    correct = [sum(s == 1.0 for s in scores[i * k:(i + 1) * k]) for i in range(len(rows))]
    return EvalResult(k, [r.id for r in rows], correct)
