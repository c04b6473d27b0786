"""A tiny local language model, so that training runs on CPU without downloads.

A word-level tokenizer (one token per digit, symbol or whitespace character, whole
words) and a Llama-architecture ``LlamaForCausalLM`` given a short supervised warm-up on
an ``ArithmeticTask`` with label noise, so that it starts imperfect like a base model and
RL groups have reward variance; or, for the reasoning recipe, on the worked solutions of a
``SynthMathTask`` (the reasoning tokenizer; checks graded by the ``math`` verifier).
``ensure_tiny_model(path, config)`` builds it once and reuses it afterwards; the folder is
a normal ``save_pretrained`` folder (model and tokenizer), loadable by transformers and
inference engines. ``ggpo-train`` builds it from a recipe's top-level ``tiny_model``
section (the quickstart and reasoning recipes); the trainer itself only ever loads a model
folder.

The architecture is Llama on purpose: with transformers 5, ``AutoTokenizer`` on a folder
whose ``config.json`` says ``model_type: qwen2`` returns Qwen2's own tokenizer and drops
the custom vocabulary.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import time
import uuid
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from filelock import FileLock, Timeout
from ggpo_verifiers import Verifier, get_verifier
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ggpo_lightning.records.errors import FolderInUseError, SettingsError
from ggpo_lightning.tasks.arithmetic import ArithmeticTask
from ggpo_lightning.tasks.synth_math import SynthMathTask, forgotten_carry, worked_solution

__all__ = ["TinyModelConfig", "build_reasoning_tokenizer", "build_tiny_model", "build_tiny_tokenizer",
           "ensure_tiny_model", "greedy_accuracy"]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
SYMBOLS = tuple("0123456789+-*/=() .,?:") + ("\n",)
WORDS = ("answer", "is", "what", "the", "sum", "of", "and", "plus", "minus", "times", "equals", "Q", "A")
# The reasoning task's (tasks/synth_math.py with worked solutions, through the paper's template): LaTeX's symbols and
# every word of its prompts and solutions, so nothing of it is <unk>
REASONING_SYMBOLS = SYMBOLS + tuple("$\\^{}")
REASONING_WORDS = (
    "Compute", "Divide", "Euclid", "Give", "Hundreds", "Let", "Move", "Multiply", "Over", "Please", "Reduce", "So",
    "Solve", "Tens", "The", "Their", "Thousands", "Units", "We", "What", "With", "a", "add", "an", "and", "answer",
    "as", "borrows", "boxed", "by", "carry", "column", "comes", "common", "divisor", "final", "first", "for",
    "frac", "fraction", "from", "give", "greatest", "integer", "is", "left", "numbers", "of", "or", "p", "powers",
    "product", "put", "reason", "reduced", "remainders", "right", "so", "step", "subtract", "sum", "terms", "the",
    "their", "then", "times", "to", "with", "within", "write", "x", "your")
TINY_MODEL_RECORD = "tiny_model.json"
# Bump when the same config builds different weights (2: cosine learning-rate schedule; 3: the reasoning
# tokenizer's words of the columns family), so
# that ensure_tiny_model rejects folders built by older code instead of silently reusing them.
_BUILD_VERSION = 3
_EVAL_PROBLEMS = 128
# Response length of the warm-up's accuracy checks: an arithmetic answer; a worked solution (the reasoning recipe's
# model.rollout.sampling.max_new_tokens, so the warm-up's target is the RL run's starting point)
_ANSWER_TOKENS, _SOLUTION_TOKENS = 8, 160

# ----------------------------------------------------------------------------- tokenizer


def build_tiny_tokenizer(symbols: tuple[str, ...] = SYMBOLS, words: tuple[str, ...] = WORDS) -> PreTrainedTokenizerFast:
    """A word-level tokenizer for arithmetic text: digits, symbols, whitespace, a few words.

    Every digit, symbol and whitespace character is one token and a run of letters is one
    word (unknown ones map to ``<unk>``), so ``decode(encode(x)) == x`` for text in the
    vocabulary. ``<bos>`` is prepended; padding is on the left, for batched generation.
    The default vocabulary is the quickstart's; :func:`build_reasoning_tokenizer` the reasoning task's.
    """
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + symbols + words)}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[A-Za-z]+|\d|\s|[^\sA-Za-z\d]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # the pieces are the text: join them without separators
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_reasoning_tokenizer() -> PreTrainedTokenizerFast:
    """:func:`build_tiny_tokenizer` for the reasoning task's worked solutions (``tasks/synth_math.py``): LaTeX's
    ``$ \\ ^ { }`` and the words of its prompts (paper's template included) and solutions; built locally."""
    return build_tiny_tokenizer(REASONING_SYMBOLS, REASONING_WORDS)


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TinyModelConfig:
    """A small Llama-architecture causal LM and its supervised warm-up on a synthetic task."""

    hidden_size: int = 128
    """Width of the residual stream (embedding size)."""
    num_layers: int = 4
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads; must divide hidden_size."""
    num_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; must divide num_heads. None: num_heads."""
    intermediate_size: int | None = None
    """Width of the MLP. None: 4 * hidden_size."""
    max_position_embeddings: int = 128
    """Longest sequence (prompt and response) in tokens."""
    seed: int = 0
    """Seed of the weight initialization."""
    task: ArithmeticTask | SynthMathTask = ArithmeticTask()
    """The task the warm-up teaches: arithmetic answers (the quickstart's tokenizer), or a ``SynthMathTask``'s worked
    solutions (:func:`build_reasoning_tokenizer`; the checks graded by the ``math`` verifier)."""
    prompt_template: str = "{prompt}"
    """Python format string of the warm-up's prompts, ``{prompt}`` the problem (``ggpo-train``: the recipe's
    ``data.prompt_template``, so that the warm-up sees the prompts the run will)."""
    sft_steps: int = 1500
    """Supervised warm-up optimizer steps; 0 keeps the random initialization. The starting accuracy
    depends on it steeply and not monotonically (default model, seed 0 / 1: 22% / 36% after 1000
    steps, 3% / 14% after 1250, 97% after 1500 for seed 0): read ``warmup_greedy_accuracy`` in
    ``tiny_model.json``."""
    sft_batch_size: int = 64
    """Problems per warm-up step."""
    sft_lr: float = 3e-3
    """Peak AdamW learning rate of the warm-up (linear ramp over 5% of the steps, then cosine decay to 0)."""
    sft_label_noise: float = 0.3
    """Fraction of warm-up targets made wrong, so the warm model is imperfect, like a base model: an arithmetic
    answer moved by +-1..3; a worked solution's final box given another problem's answer."""
    sft_forgotten_carry: float = 0.0
    """Fraction of the warm-up's ``columns`` problems with a carry or borrow whose worked solution forgets it in the
    next column and boxes that wrong result (:func:`~ggpo_lightning.tasks.synth_math.forgotten_carry`): a teacher's
    systematic slip, which the warm model learns as a habit (above 0.5 its greedy answers take it) and RL has to
    unlearn. Unlike a fixed number of steps or a target, it sets the starting accuracy by the data, not by where
    float rounding lands the warm-up. Needs a ``SynthMathTask`` with the ``columns`` family."""
    sft_seed: int = 12345
    """Seed of the warm-up problems and label noise; keep it apart from the seeds of the RL data."""
    sft_target_accuracy: float | None = None
    """Stop the warm-up at the first check (every ``sft_check_every`` steps) whose greedy accuracy on 128
    held-out warm-up problems reaches this; ``sft_steps`` is then the most steps. The accuracy a fixed number
    of steps reaches is chaotic in float rounding (the same config gave 56% on one CPU and 15% on another); a
    target brings every machine's start to about the same greedy accuracy, but not the same model: what RL then
    added to worked solutions differed per CPU and seed (+4 to +18 points; ``sft_forgotten_carry`` sets the start
    by the data instead). None = all ``sft_steps``."""
    sft_check_every: int = 25
    """Warm-up steps between two accuracy checks (with ``sft_target_accuracy``)."""

    def __post_init__(self) -> None:
        errors = [f"{name} must be an integer >= 1, got {getattr(self, name)!r}"
                  for name in ("hidden_size", "num_layers", "num_heads", "max_position_embeddings", "sft_batch_size")
                  if getattr(self, name) < 1]
        errors += [f"{name} must be None or an integer >= 1, got {getattr(self, name)!r}"
                   for name in ("num_kv_heads", "intermediate_size")
                   if getattr(self, name) is not None and getattr(self, name) < 1]
        if not errors:
            head_dim, rest = divmod(self.hidden_size, self.num_heads)
            if rest or head_dim % 2:  # rotary embeddings rotate pairs of dimensions
                errors.append(f"hidden_size / num_heads must be an even integer, got {self.hidden_size} / {self.num_heads}")
            if self.num_heads % (self.num_kv_heads or self.num_heads):
                errors.append(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.sft_target_accuracy is not None and not 0 < self.sft_target_accuracy <= 1:
            errors.append(f"sft_target_accuracy must be in (0, 1] or None, got {self.sft_target_accuracy}")
        if self.sft_check_every < 1:
            errors.append(f"sft_check_every must be >= 1, got {self.sft_check_every}")
        if self.sft_steps < 0:
            errors.append(f"sft_steps must be >= 0, got {self.sft_steps}")
        if not self.sft_lr > 0:
            errors.append(f"sft_lr must be > 0, got {self.sft_lr}")
        for name in ("sft_label_noise", "sft_forgotten_carry"):
            if not 0 <= getattr(self, name) <= 1:
                errors.append(f"{name} must be in [0, 1], got {getattr(self, name)}")
        # an ArithmeticTask is only refused when the warm-up is built (_lesson): the CLI parses this group with the
        # default task before the recipe's synthetic_data.task replaces it
        if self.sft_forgotten_carry and isinstance(self.task, SynthMathTask) and "columns" not in self.task.families:
            errors.append("sft_forgotten_carry needs a task with the columns family (synthetic_data.task.families)")
        if errors:
            raise ValueError("invalid TinyModelConfig: " + "; ".join(errors))


# ----------------------------------------------------------------------------- tiny model


def _init_model(config: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size or 4 * config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads or config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        **ids,
    )
    with torch.random.fork_rng(devices=[]):  # seed the initialization without touching the caller's RNG
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama)
    model.generation_config = GenerationConfig(**ids)
    return model


def _teacher_forced_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], targets: Sequence[str]
) -> dict[str, torch.Tensor]:
    """``<bos>prompt target<eos>`` right-padded, with labels only on the target and ``<eos>``.

    Right padding keeps position ids equal to those that ``generate`` gives a left-padded
    prompt (it counts positions from the first real token).
    """
    prompt_ids = tokenizer(list(prompts))["input_ids"]
    target_ids = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    sequences = [p + t + [tokenizer.eos_token_id] for p, t in zip(prompt_ids, target_ids)]
    shape = (len(sequences), max(map(len, sequences)))
    input_ids = torch.full(shape, tokenizer.pad_token_id)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    labels = torch.full(shape, -100)  # -100: ignored by the loss
    for i, (prompt, sequence) in enumerate(zip(prompt_ids, sequences)):
        input_ids[i, : len(sequence)] = torch.tensor(sequence)
        attention_mask[i, : len(sequence)] = 1
        labels[i, len(prompt) : len(sequence)] = torch.tensor(sequence[len(prompt) :])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _noisy_targets(rows: Sequence[dict[str, str]], noise: float, seed: int) -> list[str]:
    """Gold answers, a ``noise`` fraction of them moved by +-1..3."""
    rng = random.Random(f"label-noise/{seed}")  # independent of the problem stream of the same seed
    return [str(int(row["answer"]) + rng.choice((-3, -2, -1, 1, 2, 3))) if rng.random() < noise else row["answer"]
            for row in rows]


def _noisy_solutions(rows: Sequence[dict[str, Any]], noise: float, forgotten_carry_rate: float,
                     seed: int) -> list[str]:
    """Worked solutions: a ``forgotten_carry_rate`` fraction of those with a carry or borrow worked with the carry
    forgotten, then a ``noise`` fraction boxing another row's answer (the steps stay as they are)."""
    rng, slips = random.Random(f"label-noise/{seed}"), random.Random(f"forgotten-carry/{seed}")
    targets = []
    for row in rows:
        solution, answer = row["solution"], row["answer"]
        slipped = forgotten_carry(row["problem"])
        if slipped is not None and slips.random() < forgotten_carry_rate:
            answer, solution = slipped
        if rng.random() < noise:
            box = worked_solution([], answer)  # the last line: "The final answer is $\\boxed{...}$."
            solution = solution.removesuffix(box) + worked_solution([], rng.choice(rows)["answer"])
        targets.append(solution)
    return targets


@dataclass(frozen=True)
class _Lesson:
    """What the warm-up of a config teaches, and how its checks grade a greedy completion."""

    tokenizer: PreTrainedTokenizerFast
    prompts: list[str]
    """The warm-up's prompts, ``sft_steps * sft_batch_size`` of them, through ``prompt_template``."""
    targets: list[str]
    """Their targets, with label noise."""
    held_out: list[dict[str, str]]
    """``{"prompt", "answer"}`` of the checks: problems drawn with seed ``sft_seed + 1``."""
    verifier: str | None
    """``None``: a completion is right when, stripped, it equals the answer; else this verifier grades it."""
    max_new_tokens: int
    """Response length of a check."""


def _lesson(config: TinyModelConfig) -> _Lesson:
    """``config.task``'s warm-up: arithmetic answers (the quickstart's tokenizer, exact match) or worked solutions (the
    reasoning tokenizer, the ``math`` verifier); the only place the two tasks differ."""
    task, reasoning = config.task, isinstance(config.task, SynthMathTask)
    if config.sft_forgotten_carry and not reasoning:
        raise ValueError("sft_forgotten_carry needs worked solutions of the columns family; the arithmetic task "
                         "answers without steps")
    train = task.problems(config.sft_steps * config.sft_batch_size, seed=config.sft_seed)
    held_out = task.problems(_EVAL_PROBLEMS, seed=config.sft_seed + 1)

    def prompt(row: dict[str, Any]) -> str:  # {prompt} is the problem, as data.prompt_field maps it for the run
        return config.prompt_template.format(**{**row, "prompt": row["problem"] if reasoning else row["prompt"]})

    targets = (_noisy_solutions(train, config.sft_label_noise, config.sft_forgotten_carry, config.sft_seed)
               if reasoning else _noisy_targets(train, config.sft_label_noise, config.sft_seed))
    return _Lesson(build_reasoning_tokenizer() if reasoning else build_tiny_tokenizer(), [prompt(r) for r in train],
                   targets,
                   [{"prompt": prompt(r), "answer": r["answer"]} for r in held_out], "math" if reasoning else None,
                   _SOLUTION_TOKENS if reasoning else _ANSWER_TOKENS)


def _warmup_cosine(steps: int) -> Callable[[int], float]:
    """Learning-rate factor: linear ramp over the first 5% of steps, then cosine decay to 0."""
    ramp = max(1, steps // 20)
    return lambda step: min(1.0, (step + 1) / ramp) * 0.5 * (1.0 + math.cos(math.pi * step / max(1, steps)))


def _warm_up(model: LlamaForCausalLM, lesson: _Lesson, config: TinyModelConfig, verifier: Verifier | None) -> int:
    """Supervised warm-up: AdamW with warm-up + cosine schedule, gradient-norm clip 1.0, fresh problems per step;
    with ``sft_target_accuracy``, until a check reaches it. Returns the steps taken."""
    size = config.sft_batch_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.sft_lr, weight_decay=0.0)
    # The decay matters: at a constant 3e-3 the default model plateaued near 5% greedy
    # accuracy after 1500 steps; with the decay it reached 97%.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(config.sft_steps))
    report_every = max(1, config.sft_steps // 4)
    start = time.perf_counter()
    model.train()
    for step in range(config.sft_steps):
        chunk = slice(step * size, (step + 1) * size)
        loss = model(**_teacher_forced_batch(lesson.tokenizer, lesson.prompts[chunk], lesson.targets[chunk])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if (step + 1) % report_every == 0:
            print(f"[tiny-model] warm-up step {step + 1}/{config.sft_steps} loss {loss.item():.3f} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
        if config.sft_target_accuracy is not None and (step + 1) % config.sft_check_every == 0:
            accuracy = greedy_accuracy(model, lesson.tokenizer, lesson.held_out, lesson.max_new_tokens,
                                       verifier=verifier)
            if accuracy >= config.sft_target_accuracy:
                print(f"[tiny-model] greedy accuracy {accuracy:.3f} >= {config.sft_target_accuracy} after "
                      f"{step + 1} steps: warm-up done", flush=True)
                model.eval()
                return step + 1
    model.eval()
    return config.sft_steps


def _save_atomically(path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     record: dict[str, Any]) -> None:
    """Save into a staging folder next to ``path``, then rename it: ``path`` is complete or absent."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    staging.mkdir(parents=True)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / TINY_MODEL_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def build_tiny_model(path: str | Path, config: TinyModelConfig) -> Path:
    """Build, warm up and save the tiny model and its tokenizer into the new folder ``path``.

    Deterministic for a config (on one machine and torch version). The folder appears
    only once complete. ``tiny_model.json`` in it records the config, and, for
    information, the greedy accuracy after the warm-up on 128 problems drawn with seed
    ``sft_seed + 1`` (the warm-up samples the same problem space, so this estimates the
    starting accuracy on the task, not generalization to unseen problems; a worked solution
    is graded by the ``math`` verifier at 160 new tokens).

    Raises:
        FileExistsError: ``path`` exists (``ensure_tiny_model`` reuses an existing build).
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} already exists; use ensure_tiny_model to reuse it, or delete it to rebuild")
    lesson = _lesson(config)
    model = _init_model(config, lesson.tokenizer)
    n_parameters = sum(p.numel() for p in model.parameters())
    print(f"[tiny-model] building {path}: {n_parameters:,} parameters, {config.sft_steps} warm-up steps", flush=True)
    start = time.perf_counter()
    with get_verifier(lesson.verifier, workers=1) if lesson.verifier else contextlib.nullcontext() as verifier:
        steps = _warm_up(model, lesson, config, verifier)
        seconds = time.perf_counter() - start
        accuracy = greedy_accuracy(model, lesson.tokenizer, lesson.held_out, lesson.max_new_tokens, verifier=verifier)
    print(f"[tiny-model] warm-up took {seconds:.0f}s; greedy accuracy {accuracy:.3f}", flush=True)
    record = {"build_version": _BUILD_VERSION, "config": asdict(config), "n_parameters": n_parameters,
              "warmup_steps": steps, "warmup_seconds": round(seconds, 2), "warmup_greedy_accuracy": accuracy}
    if config.sft_target_accuracy is not None and accuracy < config.sft_target_accuracy:
        warnings.warn(f"the tiny model's warm-up ended at greedy accuracy {accuracy:.3f}, below "
                      f"sft_target_accuracy {config.sft_target_accuracy}, after all {config.sft_steps} steps; "
                      "raise tiny_model.sft_steps", stacklevel=2)
    _save_atomically(path, model, lesson.tokenizer, record)
    return path


def _differences(recorded: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    """``"key: recorded X, requested Y"`` for each differing (nested, dotted) key."""
    found = []
    for key in sorted(set(recorded) | set(wanted)):
        old, new = recorded.get(key), wanted.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            found.append(f"{prefix}{key}: recorded {old!r}, requested {new!r}")
    return found


def ensure_tiny_model(path: str | Path, config: TinyModelConfig) -> Path:
    """Return ``path`` holding the tiny model for ``config``, building it if absent.

    Raises:
        SettingsError: (a ``ValueError``) ``path`` holds a tiny model built with another config, or by code that
            builds different weights for the same config (names the differing fields).
        FolderInUseError: (a ``FileExistsError``) ``path`` exists but is not a tiny model folder.
    """
    path = Path(path)
    with _build_lock(path):  # runs started together (a sweep's shards) build it once; the others wait, then reuse
        if not path.exists():
            return build_tiny_model(path, config)
    record_path = path / TINY_MODEL_RECORD
    if not record_path.is_file():
        raise FolderInUseError(f"{path} exists but has no {TINY_MODEL_RECORD}, so it is not a tiny model "
                               f"built by ggpo-lightning; delete it or choose another path")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    # settings added later than the build take their defaults (the weights they describe are the same)
    # through JSON, so that tuples compare equal to the lists read back from the record
    recorded = {"build_version": record.get("build_version"), **_as_json(TinyModelConfig()), **record["config"]}
    wanted = {"build_version": _BUILD_VERSION, **_as_json(config)}
    if recorded["sft_target_accuracy"] is None and wanted["sft_target_accuracy"] is None:
        del recorded["sft_check_every"], wanted["sft_check_every"]  # no checks ran: they did not shape the weights
    differences = _differences(recorded, wanted)
    if differences:
        raise SettingsError(f"the tiny model at {path} was built with another config or by another version of "
                            f"ggpo-lightning ({'; '.join(differences)}); delete {path} to rebuild it, or choose "
                            f"another path")
    print(f"[tiny-model] reusing {path}", flush=True)
    return path


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock (``filelock``: an OS lock, released however the holder exits) on ``.NAME.lock`` beside
    ``path`` while ``path`` is checked and built: builds into one folder take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path.parent / f".{path.name}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"[tiny-model] another process is building {path}: waiting for it", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _as_json(config: TinyModelConfig) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(config)))


@torch.no_grad()
def greedy_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, str]],
                    max_new_tokens: int = 8, batch_size: int = 128, verifier: Verifier | None = None) -> float:
    """Fraction of ``rows`` whose greedy completion of ``row["prompt"]``, stripped, equals ``row["answer"]``; with a
    ``verifier``, the mean of its scores against ``row["answer"]``."""
    if not rows:
        raise ValueError("greedy_accuracy needs at least one row")
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        inputs = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True,
                           padding_side="left").to(model.device)
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        completions = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        answers = [r["answer"] for r in chunk]
        correct += (sum(verifier.score_batch(completions, answers)) if verifier is not None
                    else sum(c.strip() == a for c, a in zip(completions, answers)))
    model.train(was_training)
    return correct / len(rows)


# ----------------------------------------------------------------------------- loading
