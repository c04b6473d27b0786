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
the ``ggpo eval`` command (``ggpo_lightning.cli.eval``) wraps it all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ggpo_lightning.models.checkpoint import CHECKPOINT_KEY, learner_weights, read_checkpoint
from ggpo_lightning.core.distributed import rank_share, sum_across_ranks, world
from ggpo_lightning.models.sharding import is_sharded
from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.records.errors import DataError
from ggpo_lightning.records.formats import detect_format
from ggpo_lightning.records.prompts import PromptRow, load_prompt_rows, read_records
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.rollouts.protocol import Generation
from ggpo_lightning.rollouts.group import ChatTemplate, encode_prompt
from ggpo_lightning.rollouts.hf.engine import generate_responses
from ggpo_verifiers import Verifier

__all__ = ["EvalConfig", "EvalResult", "accuracy_across_ranks", "avg_at_k", "check_settings", "count_correct",
           "count_correct_with_engine", "decoding_settings", "evaluate_model", "heldout_accuracy", "load_benchmark",
           "load_model", "pass_at_k"]

PROMPT_FIELDS = ("problem", "question", "prompt")
"""Prompt fields tried in this order when ``prompt_field`` is not given (``prompt-answer`` layout)."""
ANSWER_FIELDS = ("answer", "solution")
"""Answer fields tried in this order when ``answer_field`` is not given (``prompt-answer`` layout)."""
EVAL_HINT = "map yours with --prompt-field / --answer-field, or choose the layout with --format"


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
                   limit: int | None = None, format: str | None = None) -> list[PromptRow]:
    """Problems and gold answers of a JSONL or Parquet benchmark file, read as training reads its data
    (:func:`~ggpo_lightning.records.prompts.load_prompt_rows`: one schema, the gold extracted once).

    ``format`` is the layout (:data:`~ggpo_lightning.records.formats.FORMATS`); None = detected on the first
    record (:func:`~ggpo_lightning.records.formats.detect_format`: verl, MATH, GSM8K), else the ``prompt-answer``
    layout with the prompt the first of ``problem``, ``question``, ``prompt`` the record has and the gold the
    first of ``answer``, ``solution``. Giving ``prompt_field`` / ``answer_field`` chooses the ``prompt-answer``
    layout with those fields (the other half still detected). Ids come from an ``id`` field, else
    ``file:line``. ``limit`` reads only the first N problems (a malformed row after them is never read).

    Raises:
        FileNotFoundError: no such file.
        DataError (a ValueError): the layout is unknown (lists the fields found and the flags
            ``--prompt-field`` / ``--answer-field`` / ``--format``), a record lacks a field, a solution has no
            box, or the file has no records (each names ``file:line``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    first = next(iter(read_records(path)), None)
    if first is None:
        raise DataError(f"{path}: no problems found")
    number, record = first
    if format is None and prompt_field is None and answer_field is None:
        format = detect_format(record)
    if format is None:
        prompt_field, answer_field = _detect(record, prompt_field, PROMPT_FIELDS), _detect(record, answer_field,
                                                                                            ANSWER_FIELDS)
        if prompt_field is None or answer_field is None:
            raise DataError(
                f"{path}:{number}: unknown benchmark layout (fields: {', '.join(sorted(record))}); expected a prompt "
                f"field ({', '.join(PROMPT_FIELDS)}) and an answer field ({', '.join(ANSWER_FIELDS)}); map "
                f"yours with --prompt-field and --answer-field, or choose the layout with --format")
        format = "prompt-answer"
    return load_prompt_rows(path, prompt_field or "prompt", answer_field or "answer", format=format, hint=EVAL_HINT,
                            limit=limit)


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
        FileNotFoundError, OSError: as :func:`~ggpo_lightning.models.loading.load_causal_lm`.
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


def _load_checkpoint(path: Path, base_model: str | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    checkpoint = read_checkpoint(path)
    state = checkpoint.get(CHECKPOINT_KEY, {})
    base_model = base_model or state.get("model_name_or_path")
    if base_model is None:
        raise ValueError(f"{path}: the checkpoint does not record its base model; pass --base-model with the "
                         f"run's model.model_name_or_path (in config.yaml of the run directory)")
    weights = learner_weights(checkpoint)
    if not weights:
        raise ValueError(f"{path}: its state_dict has no learner.* weights; is it a ggpo-train checkpoint?")
    model = load_causal_lm(base_model, dtype=next(iter(weights.values())).dtype)
    lora = state.get("lora")
    if lora is not None:  # base (refreshes merged in) + adapter: wrap as in training, load, merge
        from ggpo_lightning.models.lora import LoraSettings, wrap

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


@dataclass
class EvalConfig:
    """Held-out accuracy during training (recipe group ``model.eval``)."""

    max_new_tokens: int | None = None
    """Response length; None = the rollout's ``sampling.max_new_tokens``."""
    temperature: float = 0.0
    """0 = greedy pass@1; > 0 = one sample per prompt at this temperature (top-p from ``rollout.sampling``)."""
    batch_size: int = 256
    """Prompts per ``generate`` call."""

    def errors(self) -> list[str]:
        """Every invalid setting, each naming its recipe key (empty when valid)."""
        errors = []
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            errors.append(f"model.eval.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            errors.append(f"model.eval.max_new_tokens must be >= 1 or null, got {self.max_new_tokens}")
        if self.batch_size < 1:
            errors.append(f"model.eval.batch_size must be >= 1, got {self.batch_size}")
        return errors


def decoding_settings(temperature: float, top_p: float) -> dict[str, Any]:
    """``generate`` arguments: greedy at temperature 0, else sampling at ``temperature`` with nucleus ``top_p``
    (no top-k cut)."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}


@torch.no_grad()
def count_correct(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]],
                  golds: Sequence[str], verifier: Verifier, k: int, decoding: dict[str, Any], max_new_tokens: int,
                  batch_size: int, seed: int) -> list[int]:
    """Correct responses of ``k`` drawn per prompt, for this process's share of the prompts (all on one process).

    The one generate-and-score core of held-out accuracy in training and of ``ggpo eval``.
    ``batch_size`` is sequences per ``generate`` call. Sampling uses a forked RNG seeded
    with ``seed``: the result is a function of the seed (on one device and batch size),
    and torch's global RNG state is left as it was. The model is put in eval mode and
    back in its previous mode after, also on errors.

    On several processes every rank must call it: each scores its share
    (:func:`~ggpo_lightning.core.distributed.rank_share`). A sharded model's forward is a
    collective, so all ranks make the same number of ``generate`` calls (a rank out of
    prompts repeats one and discards the result) and generate with ``synced_gpus``.
    """
    rank, world_size = world()
    share = rank_share(list(zip(prompts, golds)), rank, world_size)
    flat = [p for p, _ in share for _ in range(k)]  # prompt i's samples at rows i*k .. i*k+k-1
    calls = math.ceil(math.ceil(len(prompts) / world_size) * k / batch_size)
    if is_sharded(model):
        decoding = {**decoding, "synced_gpus": True}
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    responses: list[list[int]] = []
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for start in range(0, calls * batch_size, batch_size):
                batch = flat[start:start + batch_size]
                generated = generate_responses(model, tokenizer, batch or [prompts[0]], max_new_tokens, **decoding)
                responses.extend(generated[:len(batch)])
    finally:
        model.train(was_training)
    return _correct_per_prompt(tokenizer, responses, [g for _, g in share], verifier, k)


def _correct_per_prompt(tokenizer: PreTrainedTokenizerBase, responses: Sequence[list[int]], golds: Sequence[str],
                        verifier: Verifier, k: int) -> list[int]:
    """Correct responses per prompt; prompt ``i``'s ``k`` responses are at ``i*k .. i*k+k-1``."""
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    scores = verifier.score_batch(texts, [g for g in golds for _ in range(k)]) if golds else []
    return [sum(s == 1.0 for s in scores[i * k:(i + 1) * k]) for i in range(len(golds))]


class EvalEngine(Protocol):
    """What evaluation needs from a rollout engine (:func:`~ggpo_lightning.rollouts.factory.eval_engine`)."""

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[Generation]: ...

    def greedy(self, prompt_ids: list[list[int]], max_new_tokens: int) -> list[Generation]: ...


def count_correct_with_engine(engine: EvalEngine, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]],
                              golds: Sequence[str], verifier: Verifier, k: int, temperature: float, top_p: float,
                              max_new_tokens: int, seed: int) -> list[int]:
    """:func:`count_correct` with a rollout engine's sampler, e.g. vLLM's (one process; it batches by its own
    scheduler).

    Greedy at ``temperature == 0`` (``k`` must be 1), else ``k`` samples per prompt; each
    prompt's request is seeded from a torch RNG forked and seeded with ``seed``, so the result
    is a function of the seed and torch's global RNG state is left as it was.
    """
    prompts = list(prompts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if temperature == 0:
            generations = engine.greedy(prompts, max_new_tokens)
        else:
            sampling = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
            generations = engine.generate(prompts, k, sampling)
    return _correct_per_prompt(tokenizer, [ids for g in generations for ids in g.response_ids], golds, verifier, k)


def accuracy_across_ranks(correct: list[int], k: int, total_prompts: int, device: torch.device) -> float:
    """Mean correctness over all ranks' prompts from each rank's :func:`count_correct` (a collective)."""
    summed = sum_across_ranks(torch.tensor([float(sum(correct))], dtype=torch.float64, device=device))
    return float(summed[0] / (total_prompts * k))


def evaluate_model(model: PreTrainedModel | EvalEngine, tokenizer: PreTrainedTokenizerBase,
                   rows: Sequence[PromptRow], verifier: Verifier, k: int = 1, temperature: float = 0.0,
                   top_p: float = 1.0, max_new_tokens: int = 512, batch_size: int = 64, seed: int = 0,
                   template: str = "{prompt}", chat_template: bool | ChatTemplate | dict[str, Any] = False
                   ) -> EvalResult:
    """Draw ``k`` responses per problem, score them with ``verifier``, count the correct ones (one process).

    ``model``: a transformers model, or an engine holding one (:func:`~ggpo_lightning.rollouts.factory.eval_engine`,
    ``ggpo eval --engine vllm``; ``batch_size`` then does not apply).

    Prompts are ``template.format(prompt=row.prompt)``, wrapped as the last user turn of the
    tokenizer's chat template when ``chat_template`` (true, or :class:`~ggpo_lightning.rollouts.group.ChatTemplate`
    settings: system prompt, template arguments; after the row's ``messages``). ``k == 1`` with ``temperature == 0``
    decodes greedily; otherwise samples at ``temperature`` with nucleus ``top_p`` (no
    top-k cut). ``batch_size`` is sequences per ``generate`` call; sampling is a function
    of ``seed`` (:func:`count_correct`). The gold answers should pass
    :func:`~ggpo_lightning.records.prompts.validate_golds` first (the verifier scores a bad gold 0).
    """
    check_settings(k, temperature, top_p, template)
    if not rows:
        raise ValueError("evaluate_model needs at least one problem")
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat-template is set but the tokenizer has no chat template; use --no-chat-template "
                         "or an instruction-tuned model")
    prompts = [encode_prompt(tokenizer, _apply_template(template, r.prompt), chat_template, r.messages) for r in rows]
    golds = [r.gold for r in rows]
    if not isinstance(model, torch.nn.Module):
        correct = count_correct_with_engine(model, tokenizer, prompts, golds, verifier, k, temperature, top_p,
                                            max_new_tokens, seed)
    else:
        correct = count_correct(model, tokenizer, prompts, golds, verifier, k, decoding_settings(temperature, top_p),
                                max_new_tokens, batch_size, seed)
    return EvalResult(k, [r.id for r in rows], correct)


def heldout_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]],
                     golds: Sequence[str], verifier: Verifier, config: EvalConfig, top_p: float,
                     rollout_max_new_tokens: int, device: torch.device) -> tuple[float, dict[str, float]]:
    """A training run's held-out accuracy (a collective: every rank calls it with all the prompts): greedy pass@1,
    or one sample per prompt at ``config.temperature`` from a fixed-seed forked RNG, ``config.max_new_tokens`` (or
    the rollout's) new tokens. Also the verifier's ``crashed``, ``timeout`` and ``total`` checks, summed over ranks
    (what its health is judged on); the verifier's counts are reset before and after."""
    verifier.reset_stats()
    correct = count_correct(model, tokenizer, prompts, golds, verifier, 1, decoding_settings(config.temperature, top_p),
                            config.max_new_tokens or rollout_max_new_tokens, config.batch_size, seed=0)
    stats = verifier.reset_stats()
    counts = sum_across_ranks(torch.tensor([stats.crashed, stats.timeout, stats.total], dtype=torch.float64,
                                           device=device)).tolist()
    return accuracy_across_ranks(correct, 1, len(prompts), device), dict(zip(("crashed", "timeout", "total"), counts))
