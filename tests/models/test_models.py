"""Model loading and the tiny local model: round trips through the real from_pretrained, offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from ggpo_lightning.records.errors import FolderInUseError, SettingsError
from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.tasks import tiny_model
from ggpo_lightning.tasks.tiny_model import (
    TinyModelConfig,
    build_tiny_model,
    build_tiny_tokenizer,
    ensure_tiny_model,
    greedy_accuracy,
)
from ggpo_lightning.tasks import ArithmeticTask, SynthMathTask

# GQA (1 kv head) on purpose; about 34k parameters, builds in about a second.
TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, sft_steps=30)
PROMPTS = ["1+2=", "17+25=", "99+9=", "5+60="]
ARITHMETIC_TEXTS = ["17+25=42", "what is 3*4? answer: 12.", "(8-10)=-2\n", "Q: 7+7=\nA: 14", "0"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    """The TINY model folder, built through ensure_tiny_model, and the in-memory model that was saved."""
    saved = []
    original = LlamaForCausalLM.save_pretrained

    def spy(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LlamaForCausalLM, "save_pretrained", spy)
        path = ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY)
    assert len(saved) == 1
    return path, saved[0]


def supervised_loss(model, tokenizer, rows) -> float:
    """Mean token loss of the gold answers and <eos> after the prompts (independent of the module's helper)."""
    losses = []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]
        answer = tokenizer(row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt + answer])
        labels = torch.tensor([[-100] * len(prompt) + answer])
        with torch.no_grad():
            losses.append(model(input_ids=ids, labels=labels).loss.item())
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_through_save_pretrained(tmp_path: Path):
    tok = build_tiny_tokenizer()
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    probe = "answer is 17+25=42"
    assert tok.tokenize(probe) == ["answer", " ", "is", " ", "1", "7", "+", "2", "5", "=", "4", "2"]
    assert reloaded.tokenize(probe) == tok.tokenize(probe)
    assert reloaded(probe)["input_ids"] == tok(probe)["input_ids"]
    for text in ARITHMETIC_TEXTS:
        ids = reloaded(text)["input_ids"]
        assert ids[0] == reloaded.bos_token_id and reloaded.unk_token_id not in ids
        assert reloaded.decode(ids, skip_special_tokens=True) == text
    assert (reloaded.pad_token, reloaded.bos_token, reloaded.eos_token, reloaded.unk_token) == (
        "<pad>", "<bos>", "<eos>", "<unk>")


def test_tokenizer_pads_on_the_left():
    tok = build_tiny_tokenizer()
    batch = tok(["1+1=", "17+25="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :2].tolist() == [tok.pad_token_id] * 2
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1], [1] * 7]
    assert batch["input_ids"][:, -1].tolist() == [tok.convert_tokens_to_ids("=")] * 2


# ----------------------------------------------------------------------------- tiny model


def test_tiny_model_folder_loads_back_with_identical_logits(built):
    path, in_memory = built
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    # The Llama config.json in the folder must not swap in another tokenizer class.
    assert tokenizer.tokenize("answer is 17+25=42") == build_tiny_tokenizer().tokenize("answer is 17+25=42")
    assert tokenizer.padding_side == "left"
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 1
    assert (model.config.pad_token_id, model.generation_config.eos_token_id) == (
        tokenizer.pad_token_id, tokenizer.eos_token_id)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, in_memory(**batch).logits, rtol=0, atol=0)


def test_batched_generation_with_left_padding_matches_one_prompt_at_a_time(built):
    path, _ = built
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=6, do_sample=False)
    together = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    alone = []
    for prompt in PROMPTS:
        single = tokenizer(prompt, return_tensors="pt")
        alone += tokenizer.batch_decode(model.generate(**single, max_new_tokens=6, do_sample=False)
                                        [:, single["input_ids"].shape[1]:], skip_special_tokens=True)
    assert out.shape[0] == 4 and together == alone


def test_warm_up_lowers_the_supervised_loss_and_is_recorded(built, tmp_path: Path):
    path, _ = built
    untrained = build_tiny_model(tmp_path / "untrained", TinyModelConfig(**{**TINY.__dict__, "sft_steps": 0}))
    tokenizer = load_tokenizer(path)
    rows = ArithmeticTask().problems(32, seed=999)
    before = supervised_loss(load_causal_lm(untrained), tokenizer, rows)
    after = supervised_loss(load_causal_lm(path), tokenizer, rows)
    assert after < before - 0.5, (before, after)
    record = json.loads((path / "tiny_model.json").read_text())
    assert TinyModelConfig(**{**record["config"], "task": ArithmeticTask(**record["config"]["task"])}) == TINY
    assert 0.0 <= record["warmup_greedy_accuracy"] <= 1.0 and record["n_parameters"] > 0


def test_build_is_deterministic(tmp_path: Path):
    config = TinyModelConfig(**{**TINY.__dict__, "sft_steps": 5})
    first = load_causal_lm(build_tiny_model(tmp_path / "a", config)).state_dict()
    second = load_causal_lm(build_tiny_model(tmp_path / "b", config)).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_greedy_accuracy_scores_exact_matches_across_batches(built):
    path, _ = built
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=8, do_sample=False)
    own = [c.strip() for c in tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)]
    rows = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, own)]
    assert greedy_accuracy(model, tokenizer, rows, batch_size=3) == 1.0
    wrong = [{"prompt": p, "answer": a + "0"} for p, a in zip(PROMPTS, own)]
    assert greedy_accuracy(model, tokenizer, rows[:1] + wrong[1:], batch_size=2) == 0.25


def test_ensure_reuses_a_matching_folder_without_rebuilding(built, monkeypatch):
    path, _ = built
    stamps = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(tiny_model, "build_tiny_model", no_build)
    assert ensure_tiny_model(str(path), TinyModelConfig(**TINY.__dict__)) == path
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == stamps


def _ensure_in_a_process(path: str, config: TinyModelConfig) -> str:
    return str(ensure_tiny_model(path, config))


def test_runs_started_together_build_the_model_once_and_both_use_it(tmp_path: Path, capfd):
    """Two processes (a sweep's shards) ensure the same missing model at once: one builds, the other waits on the
    build lock and reuses it; neither fails on the other's folder."""
    import multiprocessing

    config = TinyModelConfig(**{**TINY.__dict__, "sft_steps": 20})
    path = str(tmp_path / "model")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.starmap(_ensure_in_a_process, [(path, config), (path, config)])
    assert results == [path, path]
    out = capfd.readouterr().out
    assert out.count("warm-up took") == 1 and "reusing" in out  # built once, reused once
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_ensure_raises_on_a_config_mismatch_naming_the_fields(built):
    path, _ = built
    other = TinyModelConfig(**{**TINY.__dict__, "hidden_size": 64, "task": ArithmeticTask(ops="+-")})
    with pytest.raises(SettingsError, match=r"hidden_size: recorded 32, requested 64; task\.ops") as info:
        ensure_tiny_model(path, other)
    assert str(path) in str(info.value)


def test_ensure_rejects_a_folder_built_by_another_builder_version(tmp_path: Path):
    config = TinyModelConfig(**{**TINY.__dict__, "sft_steps": 0})
    path = build_tiny_model(tmp_path / "model", config)
    record = json.loads((path / "tiny_model.json").read_text())
    del record["build_version"]  # as written before the version was recorded
    (path / "tiny_model.json").write_text(json.dumps(record))
    with pytest.raises(SettingsError, match="build_version: recorded None"):
        ensure_tiny_model(path, config)


def test_ensure_and_build_refuse_a_foreign_existing_folder(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FolderInUseError, match="no tiny_model.json"):
        ensure_tiny_model(tmp_path, TINY)
    with pytest.raises(FileExistsError, match="already exists"):
        build_tiny_model(tmp_path, TINY)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_an_interrupted_build_leaves_no_folder(tmp_path: Path, monkeypatch):
    original = type(build_tiny_tokenizer()).save_pretrained

    def save_then_crash(self, *args, **kwargs):
        original(self, *args, **kwargs)  # the staging folder now holds model and tokenizer files
        raise KeyboardInterrupt

    monkeypatch.setattr(type(build_tiny_tokenizer()), "save_pretrained", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_tiny_model(tmp_path / "model", TinyModelConfig(**{**TINY.__dict__, "sft_steps": 0}))
    assert [p.name for p in tmp_path.iterdir()] == [".model.lock"]  # no model, no staging folder: the lock's file


def test_bad_config_values_are_reported_together():
    with pytest.raises(ValueError, match=r"hidden_size / num_heads.*sft_label_noise must be in \[0, 1\]"):
        TinyModelConfig(hidden_size=30, num_heads=4, sft_label_noise=1.5)
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) must divide num_heads \(4\)"):
        TinyModelConfig(num_kv_heads=3)
    with pytest.raises(ValueError, match="num_layers must be an integer >= 1"):
        TinyModelConfig(num_layers=0)
    with pytest.raises(ValueError, match=r"sft_forgotten_carry must be in \[0, 1\]"):
        TinyModelConfig(sft_forgotten_carry=-0.1)
    with pytest.raises(ValueError, match="sft_forgotten_carry needs a task with the columns family"):
        TinyModelConfig(sft_forgotten_carry=0.5, task=SynthMathTask(families=["linear"]))


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize("name", ["./no/such/model", "../missing", "/abs/missing/model", "a/b/c", "~/no-such-model-xyz"])
def test_missing_local_path_raises_file_not_found_naming_it(name: str):
    with pytest.raises(FileNotFoundError, match=f"model folder '{name}' does not exist"):
        load_causal_lm(name)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(name)


def test_missing_path_object_is_a_local_path(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "model")):
        load_causal_lm(tmp_path / "model")


def test_uncached_hub_id_offline_raises_a_clear_error():
    assert huggingface_hub.is_offline_mode(), "tests must run with HF_HUB_OFFLINE=1 (see conftest.py)"
    for load in (load_causal_lm, load_tokenizer):
        with pytest.raises(OSError, match="neither a local folder nor a model in the Hugging Face cache") as info:
            load("ggpo-test-org/no-such-model")
        assert "hf download ggpo-test-org/no-such-model" in str(info.value)


def test_cached_hub_id_loads_offline(built, tmp_path: Path):
    path, in_memory = built
    # The hub cache layout: models--{org}--{name}/refs/main -> commit, snapshots/{commit}/files.
    commit = "0" * 40
    repo = tmp_path / "models--ggpo-test-org--tiny"
    shutil.copytree(path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    model = load_causal_lm("ggpo-test-org/tiny", cache_dir=tmp_path)
    tokenizer = load_tokenizer("ggpo-test-org/tiny", cache_dir=tmp_path)
    assert tokenizer.tokenize("17+25=42") == list("17+25=42")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), in_memory.state_dict().values()))


def test_load_causal_lm_dtype(built):
    path, _ = built
    assert load_causal_lm(path, dtype="bfloat16").dtype == torch.bfloat16
    assert load_causal_lm(path, dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be a torch dtype"):
        load_causal_lm(path, dtype="bf17")


def test_load_tokenizer_pads_with_eos_when_there_is_no_pad_token_and_pads_left(tmp_path: Path):
    tok = build_tiny_tokenizer()
    tok.pad_token = None
    tok.padding_side = "right"
    tok.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no pad token; padding with its eos token '<eos>'"):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == "<eos>" and loaded.padding_side == "left"


def test_a_target_accuracy_ends_the_warm_up_at_the_first_check_that_reaches_it(tmp_path, monkeypatch):
    from ggpo_lightning.tasks import tiny_model as module

    checks = iter([0.1, 0.2, 0.6, 0.9])  # the accuracy the warm-up's checks read
    monkeypatch.setattr(module, "greedy_accuracy", lambda *a, **k: next(checks))
    config = TinyModelConfig(**{**TINY.__dict__, "sft_steps": 30, "sft_target_accuracy": 0.5, "sft_check_every": 4})
    record = json.loads((build_tiny_model(tmp_path / "model", config) / "tiny_model.json").read_text())
    assert record["warmup_steps"] == 12  # checks after steps 4, 8, 12: the third reaches 0.5
    assert record["warmup_greedy_accuracy"] == 0.9  # the final measurement, after the warm-up
    never = iter([0.1] * 100)
    monkeypatch.setattr(module, "greedy_accuracy", lambda *a, **k: next(never))
    with pytest.warns(UserWarning, match="below sft_target_accuracy 0.5, after all 8 steps; raise tiny_model.sft_steps"):
        build_tiny_model(tmp_path / "weak", TinyModelConfig(**{**config.__dict__, "sft_steps": 8}))


def test_the_check_interval_of_a_warm_up_without_a_target_does_not_force_a_rebuild(tmp_path):
    config = TinyModelConfig(**{**TINY.__dict__, "sft_steps": 2})  # no target: the checks never run
    path = build_tiny_model(tmp_path / "model", config)
    assert ensure_tiny_model(path, TinyModelConfig(**{**config.__dict__, "sft_check_every": 7})) == path
    with pytest.raises(SettingsError, match=r"sft_check_every: recorded 25, requested 7; sft_target_accuracy"):
        ensure_tiny_model(path, TinyModelConfig(**{**config.__dict__, "sft_check_every": 7,
                                                   "sft_target_accuracy": 0.5}))


def test_a_build_recorded_before_new_settings_existed_is_still_reused(built):
    path, _ = built
    record_path = path / "tiny_model.json"
    record = json.loads(record_path.read_text())
    for key in ("sft_target_accuracy", "sft_check_every"):
        record["config"].pop(key)
    record_path.write_text(json.dumps(record))
    assert ensure_tiny_model(path, TINY) == path


def test_the_reasoning_warm_up_teaches_worked_solutions_through_the_template_with_wrong_boxes_as_noise():
    from ggpo_lightning.records.prompts import PAPER_TEMPLATE
    from ggpo_lightning.tasks import SynthMathTask
    from ggpo_lightning.tasks.tiny_model import _lesson

    task = SynthMathTask(families=["arithmetic", "linear"], levels=[1])
    config = TinyModelConfig(task=task, prompt_template=PAPER_TEMPLATE, sft_steps=10, sft_batch_size=10,
                             sft_label_noise=0.5)
    lesson, rows = _lesson(config), task.problems(100, seed=config.sft_seed)
    assert lesson.prompts == [PAPER_TEMPLATE.format(prompt=row["problem"]) for row in rows]
    assert lesson.verifier == "math" and lesson.tokenizer.convert_tokens_to_ids("boxed") != lesson.tokenizer.unk_token_id
    boxed = [target.endswith(f"$\\boxed{{{row['answer']}}}$.") for target, row in zip(lesson.targets, rows)]
    assert 30 <= boxed.count(False) <= 70  # about half box another problem's answer ...
    steps = [target.rsplit("\n", 1)[0] == row["solution"].rsplit("\n", 1)[0] for target, row in zip(lesson.targets, rows)]
    assert all(steps)  # ... after the same steps
    assert [r["prompt"] for r in lesson.held_out] == [PAPER_TEMPLATE.format(prompt=row["problem"])
                                                      for row in task.problems(128, seed=config.sft_seed + 1)]


def test_the_reasoning_warm_up_forgets_carries_at_the_configured_rate_only_where_there_is_one():
    from ggpo_lightning.tasks.synth_math import forgotten_carry
    from ggpo_lightning.tasks.tiny_model import _lesson

    task = SynthMathTask(families=["columns", "linear"], levels=[1])
    config = TinyModelConfig(task=task, sft_steps=50, sft_batch_size=20, sft_label_noise=0.0, sft_forgotten_carry=0.7)
    rows = task.problems(1000, seed=config.sft_seed)
    slips = [forgotten_carry(row["problem"]) for row in rows]
    targets = _lesson(config).targets
    assert all(t == row["solution"] for t, row, s in zip(targets, rows, slips) if s is None)  # linear, no carry
    carrying = [(t, row, s) for t, row, s in zip(targets, rows, slips) if s is not None]
    taken = [t == s[1] for t, _, s in carrying]
    assert all(t == s[1] or t == row["solution"] for t, row, s in carrying)  # slipped or right, nothing else
    assert 200 < len(taken) < 300 and 0.6 < sum(taken) / len(taken) < 0.8  # ~43% of 500 columns rows carry
    # label noise on top boxes another answer after the slipped steps; the rate 0 lesson is the plain one
    noisy = _lesson(TinyModelConfig(**{**config.__dict__, "sft_label_noise": 1.0})).targets
    assert all(n.rsplit("\n", 1)[0] == t.rsplit("\n", 1)[0] for n, t in zip(noisy, targets))
    plain = _lesson(TinyModelConfig(**{**config.__dict__, "sft_forgotten_carry": 0.0})).targets
    assert plain == [row["solution"] for row in rows]
    with pytest.raises(ValueError, match="sft_forgotten_carry needs worked solutions of the columns family"):
        _lesson(TinyModelConfig(sft_forgotten_carry=0.5))  # arithmetic answers have no columns to slip in
