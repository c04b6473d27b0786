"""GGPOModule on the tiny model: steps, gradients, schedules, offline mode, resume."""

from __future__ import annotations

from dataclasses import replace

import lightning as L
import pytest
import torch

from ggpo_lightning.training.data import PromptGroupDataModule
from ggpo_lightning.evaluation.accuracy import EvalConfig
from ggpo_lightning.training.module import GGPOModule
from ggpo_lightning.core.objectives import ObjectiveConfig
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.core.objectives import ggpo_weights
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.testing import make_group

from float64_models import FLOAT64_TOLERANCE
from training_runs import fit, fit_resumable, make_data, make_module


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


class Probe(L.Callback):
    """Records, at the start of each step (after the previous step's schedules ran), what the models look like."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.rows.append({
            "step": trainer.global_step,
            "engine_is_learner": same_weights(module.engine.model, module.learner),
            "reference_is_learner": same_weights(module.reference, module.learner),
            "engine_version": module.engine.version,
        })

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rows[-1]["versions"] = [g.behavior_version for g in batch.groups]


@pytest.mark.parametrize("objective", ["ggpo", "agro", "grpo", "maxrl", "prime_rl", "m2po", "oapl", "vespo"])
def test_a_few_steps_with_each_objective_change_every_learner_parameter(tiny_model_dir, data_dir, objective):
    torch.manual_seed(0)
    module = make_module(tiny_model_dir, objective=ObjectiveConfig(objective, beta=0.1))
    before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    ref_before = {n: p.detach().clone() for n, p in module.reference.named_parameters()}
    trainer = fit(module, make_data(data_dir, prompts_per_step=6), steps=3)
    assert trainer.global_step == 3
    unchanged = [n for n, p in module.learner.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"{objective}: parameters that never changed: {unchanged}"
    assert all(torch.equal(p, ref_before[n]) for n, p in module.reference.named_parameters())
    assert module.generated_samples == 3 * 6 * 4


def test_ggpo_step_gradient_equals_the_closed_form(tiny_model_dir, tiny_lm, float64):
    _, tok = tiny_lm
    module = float64(make_module(tiny_model_dir, objective=ObjectiveConfig(beta=0.3)))
    with torch.no_grad():  # move the learner off the reference so that log pi != log pi_ref
        for p in module.learner.parameters():
            p.add_(0.05 * torch.randn_like(p))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = [
        make_group(tok("1+2=")["input_ids"], [enc("3") + [tok.eos_token_id], enc("4"), enc("12"), enc("3")],
                   [1.0, 0.0, 0.0, 1.0]),
        make_group(tok("5+5=")["input_ids"], [enc("10"), enc("1") + [tok.eos_token_id], enc("9")], [1.0, 0.0, 0.0]),
    ]
    batch = module.pack(groups)
    loss, _ = module.step_loss(batch)
    module.learner.zero_grad()
    loss.backward()
    got = [p.grad.clone() for p in module.learner.parameters()]

    # closed form: -beta * sum_i (w_i - 1/K) grad logp_i, averaged over the 2 groups
    from ggpo_lightning.core.logprobs import sequence_logprobs

    rows = (batch.input_ids, batch.attention_mask, batch.target_mask)
    logp, _ = sequence_logprobs(module.learner, *rows)
    with torch.no_grad():
        ref, _ = sequence_logprobs(module.reference, *rows)
    mask = batch.group_mask
    contrast = ggpo_weights(batch.to_groups(logp.detach()), batch.to_groups(ref), batch.rewards, 0.3, mask)  # [G, K]
    coef = (-0.3 * contrast / 2)[mask]  # [B]
    module.learner.zero_grad()
    (coef * logp).sum().backward()
    for g, e in zip(got, (p.grad for p in module.learner.parameters())):
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)
    assert any(g.abs().max() > 0 for g in got)


def test_sync_and_refresh_schedules(tiny_model_dir, data_dir):
    probe = Probe()
    module = make_module(tiny_model_dir, rollout=RolloutConfig(k=3, sync_every=2,
                                                              sampling=SamplingConfig(max_new_tokens=3)),
                         ref_refresh_every=3)
    fit(module, make_data(data_dir), steps=7, callbacks=[probe])
    assert [r["step"] for r in probe.rows] == list(range(7))
    for r in probe.rows[1:]:
        s = r["step"]
        assert r["engine_is_learner"] == (s % 2 == 0), r  # right after a sync, and only then
        assert r["reference_is_learner"] == (s % 3 == 0), r
        assert r["engine_version"] == s - s % 2
        # the groups of step s were generated by the engine as it was at the start of step s
        assert r["versions"] == [s - s % 2] * 3


def test_sync_every_step_is_on_policy(tiny_model_dir, data_dir):
    probe = Probe()
    fit(make_module(tiny_model_dir), make_data(data_dir), steps=4, callbacks=[probe])
    assert [r["versions"] for r in probe.rows] == [[s] * 3 for s in range(4)]  # staleness 0 every step


def test_the_engine_shares_the_learner_only_when_it_would_be_an_exact_copy(tiny_model_dir):
    on_policy = make_module(tiny_model_dir)
    assert on_policy.engine.model is on_policy.learner
    for kwargs in ({"sync_every": 2}, {"dtype": "bfloat16"}):
        module = make_module(tiny_model_dir, rollout=RolloutConfig(k=4, **kwargs))
        assert module.engine.model is not module.learner


def test_offline_mode_generates_only_once(tiny_model_dir, data_dir):
    module = make_module(tiny_model_dir)
    calls = []
    generate = module.engine.generate
    module.engine.generate = lambda *a, **k: calls.append(len(a[0])) or generate(*a, **k)
    dm = make_data(data_dir, mode="offline", offline_prompts=9)
    fit(module, dm, steps=5)
    assert sum(calls) == 9 and len(calls) == 3  # the first fill, in prompts_per_step chunks
    assert len(dm.buffer) == 9  # uniform replay keeps every group
    assert {g.behavior_version for g in dm.buffer.groups()} == {0}


def test_offline_from_a_buffer_file_never_generates(tiny_model_dir, data_dir, tmp_path):
    module = make_module(tiny_model_dir)
    dm = make_data(data_dir, mode="offline", offline_prompts=6)
    fit(module, dm, steps=1, tmp_path=tmp_path)
    path = tmp_path / "behavior_buffer.jsonl"  # the generated offline data, saved by the first run
    assert path.is_file()

    module2 = make_module(tiny_model_dir)
    module2.engine.generate = lambda *a, **k: pytest.fail("offline training from a file must not generate")
    dm2 = make_data(data_dir, mode="offline", buffer_path=str(path))
    fit(module2, dm2, steps=3)
    assert [g.to_dict() for g in dm2.buffer.groups()] == [g.to_dict() for g in dm.buffer.groups()]


@pytest.mark.parametrize("save_at", [4, 3], ids=["engine-synced-at-the-save", "stale-engine"])
def test_resume_continues_like_an_uninterrupted_run(tiny_model_dir, data_dir, tmp_path, save_at):
    def run(steps, ckpt_path=None, save_at=None):
        torch.manual_seed(0)
        module = make_module(tiny_model_dir, rollout=RolloutConfig(k=3, sync_every=2,
                                                                  sampling=SamplingConfig(max_new_tokens=3)),
                             ref_refresh_every=3)
        return fit_resumable(module, data_dir, tmp_path, steps, ckpt_path, save_at)

    full, full_dm, full_trainer = run(6, save_at=save_at)
    checkpoint = tmp_path / "ckpt" / f"epoch=0-step={save_at}.ckpt"
    # sync every 2: at step 4 the engine is the learner (not saved again), at step 3 it is a step behind
    assert (torch.load(checkpoint, weights_only=True)["ggpo"]["rollout"]["engine_state"] is None) == (save_at == 4)
    resumed, resumed_dm, resumed_trainer = run(6, ckpt_path=str(checkpoint))
    assert resumed_trainer.global_step == full_trainer.global_step == 6
    assert same_weights(resumed.reference, full.reference)
    assert same_weights(resumed.engine.model, full.engine.model)
    assert same_weights(resumed.learner, full.learner)
    assert resumed_dm.buffer.state_dict() == full_dm.buffer.state_dict()
    assert resumed.generated_samples == full.generated_samples


def test_configuration_errors_come_before_any_model_is_loaded(tmp_path):
    missing = tmp_path / "no-such-model"  # would fail to load: the errors must come first
    with pytest.raises(ValueError) as err:
        GGPOModule(str(missing), objective=ObjectiveConfig("ppo", beta=0.0), verifier="nope",
                   rollout=RolloutConfig(k=1))
    message = str(err.value)
    for fragment in ("model.objective.name", "model.objective.beta", "model.verifier", "model.rollout.k", "available"):
        assert fragment in message
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        GGPOModule(str(missing), verifier="numeric")


def test_non_finite_loss_is_skipped_counted_and_stops_after_a_streak(tiny_model_dir, data_dir, tmp_path,
                                                                      monkeypatch):
    module = make_module(tiny_model_dir, max_nan_steps=3)
    before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    real_loss = module.objective.loss
    monkeypatch.setattr(module, "objective", replace(module.objective, loss=lambda x, c: real_loss(x, c) * float("nan")))
    trainer = fit(module, make_data(data_dir), steps=10, tmp_path=tmp_path)
    # the skipped steps change no parameter; they still count toward max_steps
    assert module.nan_guard.total == 3 and trainer.global_step == 3
    assert all(torch.equal(p, before[n]) for n, p in module.learner.named_parameters())
    assert (tmp_path / "nan-stop.ckpt").is_file()
    assert module.last_step_metrics == {"train/nan_steps": 3.0}  # a skipped step's row: the count, nothing else


def test_an_unusable_gold_answer_fails_at_setup_naming_file_and_line(tiny_model_dir, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "\\\\frac{1}{"}\n')
    module = make_module(tiny_model_dir, verifier="math")
    module.engine.generate = lambda *a, **k: pytest.fail("no rollout before the data is checked")
    with pytest.raises(ValueError, match=rf"{train}:2: .*fix or drop the row"):
        fit(module, PromptGroupDataModule(str(train), prompts_per_step=1), steps=1, tmp_path=tmp_path)


def test_sampled_evaluation_is_repeatable_and_leaves_the_training_rng_alone(tiny_model_dir, data_dir):
    from ggpo_lightning.records.prompts import load_prompt_rows
    from ggpo_verifiers import get_verifier

    module = make_module(tiny_model_dir, eval=EvalConfig(temperature=1.0))
    module.group_rollout.verifier = get_verifier("numeric")
    rows = load_prompt_rows(data_dir / "test.jsonl")
    state = torch.get_rng_state()
    first = module.evaluate(rows)
    assert module.evaluate(rows) == first
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="model.eval.temperature"):
        make_module(tiny_model_dir, eval=EvalConfig(temperature=-1.0))


def test_chat_template_wraps_the_prompt_as_a_user_turn(tiny_model_dir):
    with pytest.raises(ValueError, match="no chat template"):
        make_module(tiny_model_dir, chat_template=True)
    module = make_module(tiny_model_dir)
    plain = module.group_rollout.encode("1+2=")
    module.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{{ m['content'] }}{% endfor %}"
    module.group_rollout.chat_template = True
    wrapped = module.group_rollout.encode("1+2=")
    assert module.tokenizer.decode(wrapped, skip_special_tokens=True) == "1+2=1+2="
    assert wrapped != plain


def _step_gradients(module: GGPOModule, groups) -> list[torch.Tensor]:
    module.learner.zero_grad()
    loss, _ = module.step_loss(module.pack(groups))
    loss.backward()
    return [p.grad.clone() for p in module.learner.parameters()]


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, tiny_lm, float64):
    _, tok = tiny_lm
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = [make_group(tok("1+2=")["input_ids"], [enc("3"), enc("4"), enc("13")], [1.0, 0.0, 0.0])]
    plain = float64(make_module(tiny_model_dir))
    checkpointed = float64(make_module(tiny_model_dir, gradient_checkpointing=True))
    assert checkpointed.learner.is_gradient_checkpointing and not plain.learner.is_gradient_checkpointing
    for g, e in zip(_step_gradients(checkpointed, groups), _step_gradients(plain, groups)):
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)


def test_bf16_mixed_precision_trains_on_cpu(tiny_model_dir, data_dir):
    torch.manual_seed(0)
    module = make_module(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    trainer = fit(module, make_data(data_dir), steps=2, precision="bf16-mixed")
    assert trainer.global_step == 2 and module.nan_guard.total == 0
    assert all(p.dtype == torch.float32 for p in module.learner.parameters())  # fp32 master weights
    assert all(p.dtype == torch.bfloat16 for p in module.reference.parameters())  # the frozen reference in bf16
    assert any(not torch.equal(p, before[n]) for n, p in module.learner.named_parameters())


def test_a_bf16_reference_gives_the_kl_term_of_an_fp32_one_under_autocast(tiny_model_dir):
    """Under bf16-mixed the reference's matmuls run in bf16 either way; keeping its weights in bf16 changes only
    the rounding of norms and embeddings: its token log-probs, and the KL term built on them, stay within bf16
    tolerance of the fp32 reference's."""
    from ggpo_lightning.core.batch import batch_token_logprobs

    module = make_module(tiny_model_dir)
    tok = module.tokenizer
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # noqa: E731
    groups = [make_group(tok(f"{a}+{b}=")["input_ids"], [enc(str(a + b)), enc("4"), enc("13")], [1.0, 0.0, 0.0],
                         prompt_id=f"p{a}{b}") for a, b in [(1, 2), (3, 4), (5, 5)]]
    batch = module.pack(groups)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        learner = batch_token_logprobs(module.learner, batch, 4096)  # [B, L]
        fp32_reference = batch_token_logprobs(module.reference, batch, 4096)
        module.policy.reference_in(torch.bfloat16)
        bf16_reference = batch_token_logprobs(module.reference, batch, 4096)
    assert next(module.reference.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(bf16_reference, fp32_reference, rtol=0, atol=0.05)
    kl_fp32 = (learner - fp32_reference).sum(-1)  # [B] per-sequence log-ratio, the KL term's summand
    kl_bf16 = (learner - bf16_reference).sum(-1)
    torch.testing.assert_close(kl_bf16, kl_fp32, rtol=0, atol=0.05)


@pytest.mark.parametrize("precision,fused,algorithm", [("bf16-mixed", True, "norm"), ("bf16-mixed", True, "value"),
                                                       ("32-true", False, "norm"), ("32-true", False, "value")])
def test_gradients_are_clipped_and_their_norm_recorded_before_clipping(tiny_model_dir, data_dir, precision, fused,
                                                                        algorithm):
    # Lightning alone refuses gradient clipping for fused optimizers under mixed precision (fp16's scaler)
    before, after, recorded = [], [], []

    def norm(module, order):
        grads = [p.grad.flatten() for p in module.learner.parameters() if p.grad is not None]
        return torch.linalg.vector_norm(torch.cat(grads), ord=order)

    class Recording(GGPOModule):
        def configure_gradient_clipping(self, optimizer, *args, **kwargs):
            before.append(norm(self, 2))
            super().configure_gradient_clipping(optimizer, *args, **kwargs)
            after.append(norm(self, 2 if algorithm == "norm" else float("inf")))
            recorded.append(self.last_step_metrics["train/grad_norm"])

    module = make_module(tiny_model_dir, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, fused=fused))
    module.__class__ = Recording
    trainer = fit(module, make_data(data_dir), steps=2, precision=precision, gradient_clip_val=1e-6,
                  gradient_clip_algorithm=algorithm)
    assert trainer.global_step == 2 and len(after) == 2 and all(n <= 1e-6 * (1 + 1e-3) for n in after)
    assert max(before) > 1e-5  # clipping had work to do (a step whose rewards are all equal has no gradient)
    torch.testing.assert_close(torch.tensor(recorded, dtype=torch.float64), torch.stack(before).double(), rtol=1e-5,
                               atol=1e-9)


@pytest.mark.parametrize("objective", ["ggpo", "grpo"])
def test_shared_prefix_rows_give_the_padded_rows_loss_and_gradients(tiny_model_dir, tiny_lm, float64, objective):
    _, tok = tiny_lm
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = [make_group(tok("1+2=")["input_ids"], [enc("3"), enc("4"), enc("13")], [1.0, 0.0, 0.0],
                         behavior_logprobs=[[-1.0], [-2.0], [-1.5, -0.5]]),
              make_group(tok("15+5=")["input_ids"], [enc("20") + [tok.eos_token_id], enc("2")], [1.0, 0.0],
                         behavior_logprobs=[[-0.1, -0.2, -0.3], [-2.0]])]
    packed, padded = (float64(make_module(tiny_model_dir, objective=ObjectiveConfig(objective), shared_prefix=s))
                      for s in (True, False))
    assert packed.pack(groups).packed is not None and padded.pack(groups).packed is None
    torch.manual_seed(0)
    with torch.no_grad():  # a learner away from the reference, the same in both
        for p, q in zip(packed.learner.parameters(), padded.learner.parameters()):
            q.copy_(p.add_(0.05 * torch.randn_like(p)))
    torch.testing.assert_close(packed.step_loss(packed.pack(groups))[0], padded.step_loss(padded.pack(groups))[0],
                               **FLOAT64_TOLERANCE)
    for g, e in zip(_step_gradients(packed, groups), _step_gradients(padded, groups)):
        torch.testing.assert_close(g, e, **FLOAT64_TOLERANCE)


def test_reference_logprobs_are_reused_until_the_reference_is_refreshed(tiny_model_dir, tiny_lm, float64,
                                                                         monkeypatch):
    from ggpo_lightning.core import batch as batch_module

    _, tok = tiny_lm
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    a = make_group(tok("1+2=")["input_ids"], [enc("3"), enc("4"), enc("13")], [1.0, 0.0, 0.0], prompt_id="a")
    b = make_group(tok("15+5=")["input_ids"], [enc("20") + [tok.eos_token_id], enc("2")], [1.0, 0.0], prompt_id="b")
    module = float64(make_module(tiny_model_dir))
    calls = []
    real = batch_module.batch_token_logprobs
    monkeypatch.setattr(batch_module, "batch_token_logprobs", lambda model, batch, chunk: calls.append(
        [g.prompt_id for g in batch.groups]) or real(model, batch, chunk))
    forward = lambda model, batch: real(model, batch, module.logprob_chunk_size)  # noqa: E731
    reference = lambda batch: module.reference_cache.token_logprobs(  # noqa: E731
        module.reference, batch, module.tokenizer.pad_token_id, module.logprob_chunk_size)
    cached = reference(module.pack([a]))  # computes a's
    both = module.pack([b, a])
    got = reference(both)  # computes b's only, reuses a's
    assert calls == [["a"], ["b"]]
    with torch.no_grad():
        recomputed = forward(module.reference, both)  # [B, L]
    assert got.dtype == torch.float64  # the cache keeps the reference's precision
    torch.testing.assert_close(got, recomputed, **FLOAT64_TOLERANCE)
    torch.testing.assert_close(got[2:, :cached.shape[1]], cached, **FLOAT64_TOLERANCE)
    with torch.no_grad():  # a new reference: nothing cached is valid any more
        next(module.learner.parameters()).add_(0.5)
    module.refresh_reference()
    with torch.no_grad():
        recomputed = forward(module.reference, both)
    torch.testing.assert_close(reference(both), recomputed, **FLOAT64_TOLERANCE)
    assert calls[-1] == ["b", "a"] and not torch.allclose(recomputed, got)
    del a, b, both
    assert not len(module.reference_cache)  # entries leave with their groups


def test_gradients_are_freed_right_after_each_update(tiny_model_dir, data_dir):
    seen = []

    class GradProbe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen.append(all(p.grad is None for p in pl_module.learner.parameters()))

    module = make_module(tiny_model_dir)
    fit(module, make_data(data_dir), steps=2, callbacks=[GradProbe()])
    assert seen == [True, True]


def test_a_rollout_under_autocast_casts_the_weights_once_and_samples_the_same(tiny_model_dir):
    from ggpo_lightning.records.prompts import PromptRow
    from ggpo_verifiers import get_verifier

    module = make_module(tiny_model_dir)
    module.group_rollout.verifier = get_verifier("numeric")
    rows = [PromptRow("a", "1+2=", "3"), PromptRow("b", "4+4=", "8")]
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):  # as Lightning's bf16-mixed
        torch.manual_seed(0)
        cached = module.group_rollout(rows)
        torch.manual_seed(0)
        prompts = [module.group_rollout.encode(r.prompt) for r in rows]
        plain = module.engine.generate(prompts, 4, module.rollout_config.sampling)
    assert [g.response_ids for g in cached] == [g.response_ids for g in plain]


def test_the_default_progress_bar_counts_optimizer_steps_and_shows_what_a_user_watches(tiny_model_dir, data_dir,
                                                                                        capsys):
    from ggpo_lightning.training.callbacks import StepProgressBar

    module = make_module(tiny_model_dir)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_model_summary=False,
                        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=make_data(data_dir))
    bar = trainer.progress_bar_callback
    assert type(bar) is StepProgressBar  # Lightning's default bar, replaced
    assert bar.total_train_batches == 3 and bar._get_train_description(0).strip() == "step"
    assert set(bar.get_metrics(trainer, module)) == {"reward", "staleness", "loss"}  # no validation ran
    assert "Epoch" not in capsys.readouterr().out
    quiet = fit(make_module(tiny_model_dir), make_data(data_dir), steps=1)  # enable_progress_bar=False stays off
    assert quiet.progress_bar_callback is None


def test_validation_does_not_shift_the_rollouts(tiny_model_dir, data_dir):
    """Two runs that differ only in how often they validate train the same weights (the validation dataloader
    draws no seed from the global RNG that samples rollouts)."""
    weights = []
    for interval in (2, 3):
        torch.manual_seed(0)
        module = make_module(tiny_model_dir)
        trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                            val_check_interval=interval, check_val_every_n_epoch=None)
        trainer.fit(module, datamodule=make_data(data_dir, val_size=4))
        weights.append([p.detach().clone() for p in module.learner.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))


def test_the_behavior_anchor_is_on_by_default_only_for_stale_ggpo(tiny_model_dir):
    stale = RolloutConfig(k=4, sync_every=8, sampling=SamplingConfig(max_new_tokens=3))
    assert make_module(tiny_model_dir, rollout=stale, objective=ObjectiveConfig(beta=0.05)).anchor_weight == 0.05
    assert make_module(tiny_model_dir, objective=ObjectiveConfig(beta=0.05)).anchor_weight == 0.0  # sync 1
    lagging = RolloutConfig(k=4, schedule="async", max_staleness=1, sampling=SamplingConfig(max_new_tokens=3))
    assert make_module(tiny_model_dir, rollout=lagging, objective=ObjectiveConfig(beta=0.05)).anchor_weight == 0.05
    in_step = RolloutConfig(k=4, schedule="async", max_staleness=0, sampling=SamplingConfig(max_new_tokens=3))
    assert make_module(tiny_model_dir, rollout=in_step, objective=ObjectiveConfig(beta=0.05)).anchor_weight == 0.0
    assert make_module(tiny_model_dir, rollout=stale, objective=ObjectiveConfig("agro")).anchor_weight == 0.0
    explicit = ObjectiveConfig("agro", behavior_anchor=0.3)
    assert make_module(tiny_model_dir, rollout=stale, objective=explicit).anchor_weight == 0.3
    with pytest.raises(ValueError, match="model.objective.behavior_anchor must be >= 0"):
        make_module(tiny_model_dir, objective=ObjectiveConfig(behavior_anchor=-1.0))


@pytest.mark.parametrize("anchor, expected", [(None, 0.05), (0.0, 0.0), (0.1, 0.1)])
def test_offline_data_is_stale_to_the_anchor_default(tiny_model_dir, data_dir, anchor, expected):
    """Replayed offline data gets the stale default (lambda = beta for GGPO) whatever rollout.sync_every says (it
    never syncs); an explicit lambda, 0 (the paper's GGPO) included, stays."""
    module = make_module(tiny_model_dir, objective=ObjectiveConfig(beta=0.05, behavior_anchor=anchor))
    assert module.anchor_weight == (0.0 if anchor is None else anchor)  # sync 1, before the data is known
    fit(module, make_data(data_dir, mode="offline", offline_prompts=3), steps=1)
    assert module.anchor_weight == expected


def test_the_anchor_adds_lambda_times_the_mean_behavior_nll(tiny_model_dir, tiny_lm):
    from ggpo_lightning.core.objectives import ggpo_loss

    _, tok = tiny_lm
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = [make_group(tok("1+2=")["input_ids"], [enc("3"), enc("4"), enc("13")], [1.0, 0.0, 0.0]),
              make_group(tok("5+5=")["input_ids"], [enc("10"), enc("2")], [1.0, 0.0])]
    module = make_module(tiny_model_dir, objective=ObjectiveConfig(beta=0.1, behavior_anchor=0.5))
    loss, inputs = module.step_loss(module.pack(groups))
    plain = ggpo_loss(inputs.logp, inputs.ref_logp, inputs.rewards, 0.1, inputs.mask)
    # the anchor: mean over the 2 groups of each group's mean -log pi(y)
    lp = inputs.logp.detach()
    anchor = (-(lp[0, :3].mean()) - lp[1, :2].mean()) / 2
    torch.testing.assert_close(loss.detach(), plain.detach() + 0.5 * anchor)


def test_drift_diagnostics_read_zero_on_policy_and_grow_with_staleness(tiny_model_dir, data_dir):
    """Synced every update, the behavior is the learner at rollout time: KL(mu || pi) is 0 up to rounding.
    Synced every 4 updates with a large step size, the learner moves off the behavior's samples."""
    logged = {}

    class Recorder(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            for name in ("kl_behavior_k1", "kl_behavior_k3", "log_mass_ratio", "logratio_ref_on_behavior",
                         "coverage_log_ratio_max", "coverage_log_ratio_p95", "coverage_ess_share",
                         "token_log_ratio_max"):
                logged.setdefault(name, []).append(pl_module.last_step_metrics[f"train/{name}"])

    fit(make_module(tiny_model_dir), make_data(data_dir), steps=3, callbacks=[Recorder()])
    assert all(abs(v) < 1e-4 for v in logged["kl_behavior_k1"] + logged["kl_behavior_k3"] + logged["log_mass_ratio"])
    assert abs(logged["logratio_ref_on_behavior"][0]) < 1e-4  # learner == reference at the first step
    assert all(abs(v) < 1e-4 for v in logged["coverage_log_ratio_max"] + logged["token_log_ratio_max"])
    assert all(v > 1 - 1e-4 for v in logged["coverage_ess_share"])  # pi = mu: every weight 1
    logged.clear()
    stale = RolloutConfig(k=4, sync_every=4, sampling=SamplingConfig(max_new_tokens=3))
    fit(make_module(tiny_model_dir, rollout=stale, objective=ObjectiveConfig(behavior_anchor=0.0),
                    optimizer=lambda p: torch.optim.AdamW(p, lr=5e-2)),
        make_data(data_dir), steps=4, callbacks=[Recorder()])
    assert abs(logged["kl_behavior_k1"][0]) < 1e-4  # the first step: nothing has moved yet
    assert logged["kl_behavior_k3"][3] > 1e-3 and all(v >= 0 for v in logged["kl_behavior_k3"])
    # coverage: the ratios spread as the learner moves (ESS below N) and leave 0, the max above the 95th percentile;
    # the max may be below 0: without the anchor the learner can lower every sampled response at once
    # (docs/METHOD.md#why-ggpo-drifts; -0.48 on an AMD EPYC, above 0 on an Intel Xeon)
    assert logged["coverage_ess_share"][3] < 0.99 and abs(logged["coverage_log_ratio_max"][3]) > 1e-3
    assert all(m >= p for m, p in zip(logged["coverage_log_ratio_max"], logged["coverage_log_ratio_p95"]))
