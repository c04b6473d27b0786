"""``ggpo eval``: accuracy, avg@k and pass@k of a model on JSONL/Parquet benchmarks.

The logic lives in :mod:`ggpo_lightning.evaluation.accuracy`; torch and transformers are
imported inside the command, so ``ggpo --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ggpo_lightning.records.formats import FORMATS
from ggpo_verifiers.cli import VERIFIER_HELP, build_verifier

__all__ = ["EVAL_VLLM_ARGS", "eval_command", "format_table"]


def format_table(report: dict[str, Any]) -> str:
    """The report as a text table: one row per benchmark, then the ``average`` row."""
    k = report["settings"]["k"]
    rows = [(b["name"], b) for b in report["benchmarks"]] + [("average", report["average"])]
    width = max(len("benchmark"), *(len(name) for name, _ in rows))
    lines = [f"{'benchmark':<{width}}  {'problems':>8}  {'accuracy':>8}  {f'avg@{k}':>8}  {f'pass@{k}':>8}"]
    for name, r in rows:
        lines.append(f"{name:<{width}}  {r['problems']:>8}  {100 * r['accuracy']:>7.1f}%  "
                     f"{100 * r['avg@k']:>7.1f}%  {100 * r['pass@k']:>7.1f}%")
    return "\n".join(lines)


EVAL_VLLM_ARGS = {"gpu_memory_utilization": 0.9, "enable_sleep_mode": False}
"""``ggpo eval``'s defaults for the vLLM engine: it has the device to itself (the training defaults leave room
for a learner, and sleep between rollouts); ``--vllm-args`` overrides them."""


def _vllm_settings(engine: str, vllm_args: str | None, device: str | None) -> dict[str, Any] | None:
    """The vLLM engine's ``LLM`` arguments for ``--engine vllm`` (None for hf); ValueError naming the flag."""
    if engine == "hf":
        if vllm_args is not None:
            raise ValueError("--vllm-args is for --engine vllm")
        return None
    from ggpo_lightning.rollouts.config import VLLM_INSTALL_HINT, vllm_available

    if not vllm_available():
        raise ValueError(f"--engine vllm needs vLLM, which is not installed: {VLLM_INSTALL_HINT}")
    if device is not None:
        raise ValueError("--device is for --engine hf: vLLM places the model on its platform's device "
                         "(choose GPUs with CUDA_VISIBLE_DEVICES)")
    try:
        parsed = json.loads(vllm_args or "{}")
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(f"--vllm-args must be a JSON object of vllm.LLM arguments, e.g. "
                         f"'{{\"max_model_len\": 4096}}'; got {vllm_args!r}")
    return {**EVAL_VLLM_ARGS, **parsed}


def _verify_source(path: Path) -> None:
    """Check a checkpoint or a run's export against its SHA-256 sidecar before it loads (CheckpointError, a
    ValueError, on damage; a warning for a checkpoint without one); hub ids and folders without one pass."""
    from ggpo_lightning.records.integrity import check_checkpoint, check_intact, sidecar

    if path.suffix == ".ckpt":
        check_checkpoint(path)
        return
    for folder in (path, path / "final_model", path / "final_adapter"):
        if sidecar(folder).is_file():
            check_intact(folder)


def _run_settings(ctx: click.Context, model_source: str) -> dict[str, Any]:
    """For a run directory MODEL: its recipe's template, chat template, length and verifier
    (:func:`~ggpo_lightning.evaluation.run_settings.run_settings`) for each of those flags left at its default;
    what was taken is said on stderr. Empty for any other MODEL."""
    from ggpo_lightning.evaluation.run_settings import run_settings

    try:
        run = run_settings(model_source)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if run is None:
        return {}
    flags = {"template": "template", "chat_template": "chat_template", "max_new_tokens": "max_new_tokens",
             "verifier": "verifier"}
    taken = {key: getattr(run, key) for key, flag in flags.items()
             if ctx.get_parameter_source(flag) is not ParameterSource.COMMANDLINE}
    if "verifier" in taken:
        taken["verifier_timeout"] = run.verifier_timeout
    if taken:
        click.echo(f"settings of the run ({run.config_path}): " + ", ".join(f"{k} {v!r}" for k, v in taken.items()),
                   err=True)
    return taken


def _chat_settings(ctx: click.Context, chat_template: Any, system: str | None, kwargs: str | None) -> Any:
    """``--chat-template`` with ``--system-prompt`` and ``--chat-template-kwargs`` (either turns the template on, over
    a run directory's settings: the flags given replace their fields); ValueError naming a flag."""
    if system is None and kwargs is None:
        return chat_template
    if not chat_template and ctx.get_parameter_source("chat_template") is ParameterSource.COMMANDLINE:
        raise ValueError("--system-prompt and --chat-template-kwargs go through the chat template: leave out "
                         "--no-chat-template")
    settings = dict(chat_template) if isinstance(chat_template, dict) else {}
    if system is not None:
        settings["system"] = system
    if kwargs is not None:
        try:
            settings["kwargs"] = json.loads(kwargs)
        except json.JSONDecodeError:
            settings["kwargs"] = None
        if not isinstance(settings["kwargs"], dict):
            raise ValueError(f"--chat-template-kwargs must be a JSON object, e.g. '{{\"enable_thinking\": false}}'; "
                             f"got {kwargs!r}")
    return settings


@click.command("eval")
@click.argument("model_source", metavar="MODEL")
@click.argument("benchmarks", metavar="BENCH...", nargs=-1,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--benchmark", "named", multiple=True, help="A benchmark by name (math500, aime2024, amc2023, "
              "minerva_math, olympiadbench), read from the local file of the --path at the same position, with its "
              "layout and the paper's template (--template overrides it). Repeatable.")
@click.option("--path", "named_paths", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The local file of each --benchmark, in order.")
@click.option("--verifier", "-v", default="math", show_default=True, help=VERIFIER_HELP)
@click.option("--k", type=click.IntRange(min=1), default=1, show_default=True, help="Responses per problem.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0 = greedy (needs --k 1).")
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Sequences per generate call.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampling RNG (per benchmark).")
@click.option("--template", default="{prompt}", show_default=True,
              help="Python format string of the prompt; {prompt} is the problem text.")
@click.option("--chat-template/--no-chat-template", default=False, show_default=True,
              help="Wrap each prompt as a user turn of the tokenizer's chat template.")
@click.option("--system-prompt", default=None, help="A system turn before each prompt, through the chat template "
              "(turned on by this flag).")
@click.option("--chat-template-kwargs", default=None, help="A JSON object of the chat template's own arguments, e.g. "
              "'{\"enable_thinking\": false}' (turns the chat template on; a name the template does not read is an "
              "error).")
@click.option("--format", "data_format", type=click.Choice(FORMATS), default=None,
              help="The files' layout (docs/data.md); default: detected from the first row (verl, math, gsm8k, "
                   "else prompt-answer).")
@click.option("--prompt-field", default=None, help="prompt-answer layout: record field of the problem (default: "
              "problem, question or prompt, the first present).")
@click.option("--answer-field", default=None, help="prompt-answer layout: record field of the gold answer "
              "(default: answer, else the last \\boxed{} of solution).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N problems of each file.")
@click.option("--base-model", default=None,
              help="For a .ckpt MODEL: the run's model.model_name_or_path (architecture and tokenizer).")
@click.option("--device", default=None, help="torch device (default: cuda if available, else cpu; --engine hf).")
@click.option("--engine", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="What samples: hf (transformers generate) or vllm (a vLLM engine holding the model; needs vLLM, "
                   "see docs/training-one-gpu.md).")
@click.option("--vllm-args", default=None, help="For --engine vllm: a JSON object of more vllm.LLM arguments, e.g. "
              "'{\"max_model_len\": 4096, \"gpu_memory_utilization\": 0.5}' (one device: the engine runs in this "
              "process).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the results, with per-problem counts, to this JSON file.")
def eval_command(model_source: str, benchmarks: tuple[Path, ...], named: tuple[str, ...],
                 named_paths: tuple[Path, ...], verifier: str, k: int, temperature: float,
                 top_p: float, max_new_tokens: int, batch_size: int, seed: int, template: str, chat_template: bool,
                 system_prompt: str | None, chat_template_kwargs: str | None, data_format: str | None, prompt_field: str | None, answer_field: str | None, limit: int | None,
                 base_model: str | None, device: str | None, engine: str, vllm_args: str | None,
                 json_path: Path | None) -> None:
    """Evaluate MODEL on each benchmark file BENCH (JSONL or Parquet).

    MODEL is a model folder or hub id, a ggpo-train run directory (its final_model/), or
    a run's .ckpt (with --base-model). A run directory is evaluated with its recipe's settings (config.yaml:
    data.prompt_template, model.chat_template, model.eval.max_new_tokens or the rollout's, model.verifier);
    a flag given overrides its setting. Prints accuracy (pass@1), avg@k and pass@k per
    benchmark and their unweighted mean over the benchmarks (the average row's problems
    is the total).
    """
    from ggpo_lightning.evaluation import accuracy as evaluation
    from ggpo_lightning.records.prompts import validate_golds

    settings = _run_settings(click.get_current_context(), model_source)
    if settings:
        verifier = settings.get("verifier", verifier)
        template = settings.get("template", template)
        chat_template = settings.get("chat_template", chat_template)
        max_new_tokens = settings.get("max_new_tokens", max_new_tokens)
    try:
        evaluation.check_settings(k, temperature, top_p, template)
        engine_args = _vllm_settings(engine, vllm_args, device)
        chat_template = _chat_settings(click.get_current_context(), chat_template, system_prompt, chat_template_kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    problems = _problems(benchmarks, named, named_paths, template, prompt_field, answer_field, limit, data_format)
    with build_verifier(verifier, timeout=settings.get("verifier_timeout", 5.0), workers=None) as checker:
        try:
            for _, _, rows, _ in problems:
                validate_golds(rows, checker)
            sampler, tokenizer = _sampler(model_source, base_model, chat_template, engine_args, device)
        except (ValueError, OSError) as exc:  # OSError: FileNotFoundError, an uncached hub id offline
            raise click.ClickException(str(exc)) from None
        entries = []
        for name, path, rows, prompt_template in problems:
            click.echo(f"{name}: {len(rows)} problems x {k} responses ...", err=True)
            try:
                result = evaluation.evaluate_model(
                    sampler, tokenizer, rows, checker, k=k, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, template=prompt_template,
                    chat_template=chat_template)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
            entries.append({"name": name, "path": str(path), "template": prompt_template, **result.to_dict()})
    average = {metric: sum(e[metric] for e in entries) / len(entries) for metric in ("accuracy", "avg@k", "pass@k")}
    report = {
        "model": model_source, "base_model": base_model,
        "settings": {"engine": engine, "verifier": verifier, "k": k, "temperature": temperature, "top_p": top_p,
                     "max_new_tokens": max_new_tokens, "batch_size": batch_size, "seed": seed, "template": template,
                     "chat_template": chat_template, "limit": limit},
        "benchmarks": entries,
        "average": {"problems": sum(e["problems"] for e in entries), **average},
    }
    click.echo(format_table(report))
    if json_path is not None:
        from ggpo_lightning.records.atomic import atomic_write_text

        atomic_write_text(json_path, json.dumps(report, indent=2) + "\n")
        click.echo(f"results written to {json_path}")


def _problems(benchmarks: tuple[Path, ...], named: tuple[str, ...], named_paths: tuple[Path, ...], template: str,
              prompt_field: str | None, answer_field: str | None, limit: int | None,
              data_format: str | None) -> list[tuple[str, Path, list, str]]:
    """``(name, path, rows, template)`` of each benchmark: the files, then the named ones (with their own template
    unless --template was given); ``click.UsageError`` or ``click.ClickException`` naming what is wrong."""
    from ggpo_lightning.evaluation import accuracy as evaluation
    from ggpo_lightning.evaluation.benchmarks import load_named_benchmark

    if len(named) != len(named_paths):
        raise click.UsageError(f"give one --path per --benchmark ({len(named)} --benchmark, {len(named_paths)} --path)")
    if not benchmarks and not named:
        raise click.UsageError("give benchmark files (BENCH...) or --benchmark NAME --path FILE")
    explicit_template = click.get_current_context().get_parameter_source("template") is ParameterSource.COMMANDLINE
    try:
        problems = [(path.stem, path, evaluation.load_benchmark(path, prompt_field, answer_field, limit, data_format),
                     template) for path in benchmarks]
        for name, path in zip(named, named_paths):
            benchmark, rows = load_named_benchmark(name, path, limit)
            problems.append((name, path, rows, template if explicit_template else benchmark.template))
    except (ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None
    return problems


def _sampler(model_source: str, base_model: str | None, chat_template: Any, engine_args: dict | None,
             device: str | None) -> tuple[Any, Any]:
    """``(sampler, tokenizer)``: the model on ``device`` (the HF path), or a vLLM engine holding it (``engine_args``
    given); ``click.UsageError`` when the chat template does not fit the tokenizer."""
    import torch

    from ggpo_lightning.evaluation import accuracy as evaluation
    from ggpo_lightning.rollouts.group import chat_template_errors

    _verify_source(Path(model_source).expanduser())
    model, tokenizer = evaluation.load_model(model_source, base_model)
    problems_of_template = chat_template_errors(tokenizer, chat_template, model_source, "--chat-template",
                                                "--chat-template-kwargs")
    if problems_of_template:
        raise click.UsageError("; ".join(problems_of_template))
    if engine_args is None:
        return model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")), tokenizer
    from ggpo_lightning.rollouts.factory import eval_engine

    return eval_engine(model, tokenizer, engine_args), tokenizer  # the engine holds its own copy of the weights
