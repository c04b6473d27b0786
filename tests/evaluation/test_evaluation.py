"""``ggpo eval``: pass@k / avg@k, benchmark layouts, model sources, the evaluation loop and the command."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ggpo_lightning.records.prompts import PromptRow
from ggpo_lightning.rollouts.group import chat_messages, chat_settings, encode_prompt
from ggpo_lightning.cli.eval import eval_command
from ggpo_lightning.evaluation.accuracy import (
    EvalResult,
    avg_at_k,
    evaluate_model,
    load_benchmark,
    load_model,
    pass_at_k,
)
from ggpo_verifiers import get_verifier

# The tiny test model answers "1" to every sum greedily: half of these are right.
ROWS = [PromptRow("a", "1+0=", "1"), PromptRow("b", "1+2=", "3"), PromptRow("c", "0+1=", "1"),
        PromptRow("d", "4+5=", "9")]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ----------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_pass_at_k_equals_the_fraction_of_k_subsets_holding_a_correct_sample(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))  # samples 0 .. c-1 are the correct ones
            expected = sum(any(i < c for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n_and_rejects_impossible_counts():
    assert pass_at_k(200, 10, 100) == pytest.approx(1 - math.comb(190, 100) / math.comb(200, 100), rel=1e-12)
    assert pass_at_k(1000, 1, 1) == pytest.approx(1e-3)
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(n, c, k)


def test_avg_at_k_and_the_benchmark_means():
    assert avg_at_k(3, 4) == 0.75 and avg_at_k(0, 1) == 0.0
    with pytest.raises(ValueError, match="avg_at_k"):
        avg_at_k(5, 4)
    result = EvalResult(4, ["a", "b", "c"], [0, 2, 4])
    assert result.metrics == pytest.approx({"accuracy": 0.5, "avg@k": 0.5, "pass@k": 2 / 3})
    assert result.to_dict()["per_problem"] == [{"id": "a", "correct": 0}, {"id": "b", "correct": 2},
                                               {"id": "c", "correct": 4}]


# ----------------------------------------------------------------------------- benchmark layouts


def test_the_three_layouts_are_detected(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = write_jsonl(tmp_path / "math.jsonl", [{"problem": "2+2?", "answer": "4", "solution": "\\boxed{5}",
                                                      "id": "m1"}])
    questions = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "2"}])
    solutions = tmp_path / "sol.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "x?", "solution": "so \\boxed{1} then \\boxed{\\frac{1}{2}}."}]),
                   solutions)
    assert load_benchmark(problems) == [PromptRow("m1", "2+2?", "4", f"{problems}:1")]  # answer beats solution
    assert load_benchmark(questions) == [PromptRow("gsm.jsonl:1", "1+1?", "2", f"{questions}:1")]
    assert load_benchmark(solutions) == [PromptRow("sol.parquet:1", "x?", "\\frac{1}{2}", f"{solutions}:1")]


def test_field_overrides_and_limit(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [{"text": f"q{i}", "final": str(i), "problem": "p", "answer": "a"}
                                              for i in range(5)])
    rows = load_benchmark(path, prompt_field="text", answer_field="final", limit=2)
    assert [(r.prompt, r.gold) for r in rows] == [("q0", "0"), ("q1", "1")]
    assert [(r.prompt, r.gold) for r in load_benchmark(path, answer_field="final", limit=1)] == [("p", "0")]


def test_layout_errors_name_the_fields_the_flags_and_the_line(tmp_path):
    unknown = write_jsonl(tmp_path / "u.jsonl", [{"input": "1+1", "target": "2"}])
    with pytest.raises(ValueError) as err:
        load_benchmark(unknown)
    message = str(err.value)
    for fragment in (f"{unknown}:1", "unknown benchmark layout", "fields: input, target", "--prompt-field",
                     "--answer-field"):
        assert fragment in message
    ragged = write_jsonl(tmp_path / "r.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b"}])
    with pytest.raises(ValueError, match=rf"{ragged}:2: missing field 'answer' .*--answer-field"):
        load_benchmark(ragged)
    unboxed = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "a", "solution": "it is 3"}])
    with pytest.raises(ValueError, match=rf"{unboxed}:1: field 'solution' gives no gold: the solution marks no"):
        load_benchmark(unboxed)


# ----------------------------------------------------------------------------- the evaluation loop


def test_sampled_evaluation_is_a_function_of_the_seed_and_leaves_the_global_rng_alone(tiny_lm):
    model, tokenizer = tiny_lm
    verifier = get_verifier("numeric")
    settings = dict(k=4, temperature=1.0, max_new_tokens=3, batch_size=6, seed=3)
    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = evaluate_model(model, tokenizer, ROWS, verifier, **settings)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(2)  # another global state: same result
    assert evaluate_model(model, tokenizer, ROWS, verifier, **settings) == first
    assert first.ids == ["a", "b", "c", "d"] and all(0 <= c <= 4 for c in first.correct)
    assert first.metrics["pass@k"] >= first.metrics["avg@k"] == first.metrics["accuracy"]
    with pytest.raises(ValueError, match="--k 4 with --temperature 0"):
        evaluate_model(model, tokenizer, ROWS, verifier, k=4, temperature=0.0)
    with pytest.raises(ValueError, match="--template"):
        evaluate_model(model, tokenizer, ROWS, verifier, template="{question}")


def test_greedy_accuracy_equals_the_modules_evaluate(tiny_model_dir, tiny_lm):
    from ggpo_lightning.training.module import GGPOModule
    from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig

    module = GGPOModule(str(tiny_model_dir), verifier="numeric",
                        rollout=RolloutConfig(k=2, sampling=SamplingConfig(max_new_tokens=3)))
    module.group_rollout.verifier = get_verifier("numeric")
    model, tokenizer = tiny_lm
    result = evaluate_model(model, tokenizer, ROWS, get_verifier("numeric"), max_new_tokens=3, batch_size=256)
    assert result.correct == [1, 0, 1, 0]
    assert result.metrics["accuracy"] == module.evaluate(ROWS) == 0.5


# ----------------------------------------------------------------------------- the command and model sources


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 2-step ggpo-train run: final_model/, checkpoints/last.ckpt, config.yaml."""
    from ggpo_lightning.cli.train import run_training

    tmp = tmp_path_factory.mktemp("eval-run")
    cli = run_training([
        "--config", str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"),
        "--model.model_name_or_path", str(tiny_model_dir), "--tiny_model", "null",
        "--model.rollout.k", "2", "--model.rollout.sampling.max_new_tokens", "3",
        "--model.optimizer.init_args.lr", "0.01",
        "--data.train_path", str(tmp / "data" / "train.jsonl"), "--data.val_path", str(tmp / "data" / "test.jsonl"),
        "--synthetic_data.n_train", "16", "--synthetic_data.n_test", "4", "--data.prompts_per_step", "2",
        "--trainer.logger.init_args.save_dir", str(tmp / "runs"), "--trainer.max_steps", "2",
    ])
    return Path(cli.trainer.log_dir)


@pytest.fixture()
def bench(tmp_path) -> Path:
    return write_jsonl(tmp_path / "sums.jsonl", [{"problem": r.prompt, "answer": r.gold, "id": r.id} for r in ROWS])


def invoke(*args: str):
    return CliRunner().invoke(eval_command, [str(a) for a in args])


def test_the_command_prints_a_table_and_writes_json(tiny_model_dir, bench, tmp_path):
    out = tmp_path / "out" / "eval.json"
    again = tmp_path / "again.jsonl"
    again.write_text(bench.read_text())
    result = invoke(tiny_model_dir, bench, again, "--verifier", "numeric", "--k", "2", "--temperature", "1",
                    "--max-new-tokens", "3", "--json", out)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "benchmark  problems  accuracy     avg@2    pass@2" in lines
    assert [line.split()[0] for line in lines[-4:-1]] == ["sums", "again", "average"]
    report = json.loads(out.read_text())
    assert set(report) == {"model", "base_model", "settings", "benchmarks", "average"}
    assert report["settings"]["k"] == 2 and report["settings"]["verifier"] == "numeric"
    first, second = report["benchmarks"]
    assert set(first) == {"name", "path", "template", "problems", "k", "accuracy", "avg@k", "pass@k", "per_problem"}
    assert first["name"] == "sums" and second["name"] == "again" and first["problems"] == 4
    assert [first[m] for m in ("k", "accuracy", "per_problem")] == [second[m] for m in ("k", "accuracy", "per_problem")]
    assert [p["id"] for p in first["per_problem"]] == ["a", "b", "c", "d"]
    assert report["average"] == {"problems": 8, **{m: first[m] for m in ("accuracy", "avg@k", "pass@k")}}
    assert not list(out.parent.glob("*.tmp"))


def test_command_errors_name_the_culprit(tiny_model_dir, bench, tmp_path):
    result = invoke(tiny_model_dir, bench, "--k", "3")
    assert result.exit_code == 2 and "--temperature" in result.output
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "1+1=", "answer": "two"}])
    result = invoke(tiny_model_dir, bad, "--verifier", "numeric")
    assert result.exit_code == 1 and f"{bad}:1" in result.output
    result = invoke(tmp_path, bench, "--verifier", "numeric")  # a folder with neither config.json nor final_model
    assert result.exit_code == 1 and "neither a model folder" in result.output


def test_a_run_directory_and_its_checkpoint_are_model_sources(run_dir, tiny_model_dir, bench, tmp_path):
    exported, _ = load_model(run_dir)
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match="--base-model is for .ckpt sources only"):
        load_model(run_dir, base_model=str(tiny_model_dir))
    trained = exported.state_dict()
    for base in (None, str(tiny_model_dir)):  # recorded in the checkpoint, or given
        restored, _ = load_model(checkpoint, base_model=base)
        assert all(torch.equal(v, trained[k]) for k, v in restored.state_dict().items())  # the learner at step 2
    state = torch.load(checkpoint, weights_only=True)
    del state["ggpo"]["model_name_or_path"]
    torch.save(state, tmp_path / "anonymous.ckpt")
    with pytest.raises(ValueError, match="--base-model"):
        load_model(tmp_path / "anonymous.ckpt")

    # the weights come from the checkpoint's learner.* entries, not from the base model
    state = torch.load(checkpoint, weights_only=True)
    state["state_dict"]["learner.lm_head.weight"] += 1.0
    torch.save(state, tmp_path / "edited.ckpt")
    edited, _ = load_model(tmp_path / "edited.ckpt", base_model=str(tiny_model_dir))
    assert torch.equal(edited.lm_head.weight, trained["lm_head.weight"] + 1.0)

    result = invoke(checkpoint, bench, "--base-model", tiny_model_dir, "--verifier", "numeric",
                    "--max-new-tokens", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == invoke(run_dir, bench, "--verifier", "numeric", "--max-new-tokens", "3").stdout


def test_a_run_directory_is_evaluated_with_its_recipes_settings(run_dir, bench, tmp_path):
    """Finding 5: ``ggpo eval RUN_DIR`` used ``{prompt}``, 512 new tokens and the math verifier, not the run's."""
    import shutil

    import yaml

    run_dir = Path(shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints")))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["prompt_template"] = "Q: {prompt}"  # a template of its own, to be seen in the report
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    result = invoke(run_dir, bench, "--json", tmp_path / "run.json")
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "run.json").read_text())["settings"]
    assert settings["template"] == "Q: {prompt}"
    assert settings["max_new_tokens"] == config["model"]["rollout"]["sampling"]["max_new_tokens"] == 3
    assert settings["verifier"] == config["model"]["verifier"] == "numeric"
    assert settings["chat_template"] is False
    assert f"settings of the run ({run_dir / 'config.yaml'})" in result.stderr
    explicit = invoke(run_dir, bench, "--template", config["data"]["prompt_template"], "--max-new-tokens", "3",
                      "--verifier", "numeric", "--no-chat-template")
    assert explicit.stdout in result.stdout  # the same evaluation, spelt out (then the line naming the JSON)
    invoke(run_dir, bench, "--max-new-tokens", "1", "--json", tmp_path / "short.json")
    assert json.loads((tmp_path / "short.json").read_text())["settings"]["max_new_tokens"] == 1  # a flag wins


def test_limit_reads_only_the_rows_it_needs(tiny_model_dir, tmp_path):
    """Issue 40: ``ggpo eval --limit 2`` failed on a malformed row 3."""
    bench = tmp_path / "sums.jsonl"
    bench.write_text("".join(json.dumps({"problem": r.prompt, "answer": r.gold}) + "\n" for r in ROWS[:2])
                     + "{not json\n")
    result = invoke(tiny_model_dir, bench, "--limit", "2", "--verifier", "numeric", "--max-new-tokens", "2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-2].split()[:2] == ["sums", "2"]
    whole = invoke(tiny_model_dir, bench, "--verifier", "numeric", "--max-new-tokens", "2")
    assert whole.exit_code == 1 and f"{bench}:3: not valid JSON" in whole.output  # the row is read without --limit


def test_a_system_prompt_and_template_arguments_for_a_plain_model_folder(qwen3_model_dir, bench, tmp_path,
                                                                        monkeypatch):
    """Issue 40: ``ggpo eval`` had no way to pass a system prompt or the chat template's arguments."""
    from ggpo_lightning.evaluation import accuracy

    encoded = []

    def encode(tokenizer, text, chat_template=False, messages=None):  # the prompt as text (the tiny vocabulary
        chat = chat_settings(chat_template)  # has no letters)
        encoded.append(tokenizer.apply_chat_template(chat_messages(text, chat, messages), add_generation_prompt=True,
                                                     tokenize=False, **chat.kwargs))
        return encode_prompt(tokenizer, text, chat_template, messages)

    monkeypatch.setattr(accuracy, "encode_prompt", encode)
    result = invoke(qwen3_model_dir, bench, "--system-prompt", "Answer with a number.", "--chat-template-kwargs",
                    '{"enable_thinking": false}', "--verifier", "numeric", "--max-new-tokens", "2",
                    "--json", tmp_path / "eval.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval.json").read_text())["settings"]["chat_template"] == {
        "system": "Answer with a number.", "kwargs": {"enable_thinking": False}}
    assert len(encoded) == 4 and all(e.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>\n")
                                     and e.endswith("<think>\n\n</think>\n\n") for e in encoded)
    typo = invoke(qwen3_model_dir, bench, "--chat-template-kwargs", '{"enable_thinkin": false}', "--verifier",
                  "numeric")
    assert typo.exit_code == 2 and ("--chat-template-kwargs enable_thinkin is not a variable of the chat template "
                                    f"of {qwen3_model_dir}, which would ignore it; did you mean enable_thinking?"
                                    ) in typo.output
    both = invoke(qwen3_model_dir, bench, "--system-prompt", "x", "--no-chat-template")
    assert both.exit_code == 2 and "leave out --no-chat-template" in both.output
