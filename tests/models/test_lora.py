"""LoRA on the tiny model: adapter-only training, reference with the adapter off, refresh by merging,
merged rollout sync, memory, resume, exports and the bad-input errors."""

from __future__ import annotations

import json
import shutil

import lightning as L
import pytest
import torch

from ggpo_lightning.core.logprobs import sequence_logprobs
from ggpo_lightning.models.lora import LoraSettings, lora_layers
from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.training.module import GGPOModule
from ggpo_lightning.core.objectives import ObjectiveConfig
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.rollouts.config import SamplingConfig
from ggpo_lightning.testing import make_group
from training_runs import fit, fit_resumable, make_data, make_module

pytest.importorskip("peft")

LORA = LoraSettings(r=4, alpha=8.0)


def make_lora_module(model_dir, **kwargs) -> GGPOModule:
    kwargs.setdefault("lora", LORA)
    return make_module(model_dir, **kwargs)


def adapter_names(module: GGPOModule) -> set[str]:
    return {n for n, _ in module.learner.named_parameters() if ".lora_" in n}


def batch_rows(module: GGPOModule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tok = module.tokenizer
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = [make_group(tok("1+2=")["input_ids"], [enc("3") + [tok.eos_token_id], enc("4"), enc("12")],
                         [1.0, 0.0, 0.0]),
              make_group(tok("5+4=")["input_ids"], [enc("9"), enc("1") + [tok.eos_token_id], enc("8")],
                         [1.0, 0.0, 0.0])]
    batch = module.pack(groups)
    return batch.input_ids, batch.attention_mask, batch.target_mask


@torch.no_grad()
def logprobs(model: torch.nn.Module, rows) -> torch.Tensor:
    was_training = model.training
    model.eval()
    out = sequence_logprobs(model, *rows)[0]  # [B]
    model.train(was_training)
    return out


@torch.no_grad()
def reference_logprobs(module: GGPOModule, rows) -> torch.Tensor:
    with module.policy.reference_model() as reference:
        return sequence_logprobs(reference, *rows)[0]


@torch.no_grad()
def perturb_adapter(module: GGPOModule) -> None:
    """Move the adapter off zero, as training would (B = 0 at the start makes it a no-op)."""
    for name, p in module.learner.named_parameters():
        if ".lora_" in name:
            p.add_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("objective", ["ggpo", "agro", "grpo", "maxrl"])
def test_a_few_steps_with_each_objective_change_only_adapter_parameters(tiny_model_dir, data_dir, objective):
    torch.manual_seed(0)
    module = make_lora_module(tiny_model_dir, objective=ObjectiveConfig(objective, beta=0.1))
    before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    trainer = fit(module, make_data(data_dir, prompts_per_step=6), steps=3)
    assert trainer.global_step == 3 and module.nan_guard.total == 0
    changed = {n for n, p in module.learner.named_parameters() if not torch.equal(p, before[n])}
    assert changed == adapter_names(module), f"{objective}: changed {changed ^ adapter_names(module)}"
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for n, p in module.learner.named_parameters() if n in adapter_names(module)}
    assert module.reference is None


def test_reference_is_the_base_model_with_the_adapter_off(tiny_model_dir, tiny_lm):
    module = make_lora_module(tiny_model_dir, lora=LoraSettings(r=4, alpha=8.0, dropout=0.1))
    perturb_adapter(module)
    rows = batch_rows(module)
    base, _ = tiny_lm
    torch.testing.assert_close(reference_logprobs(module, rows), logprobs(base, rows), rtol=0, atol=0)
    assert not torch.allclose(logprobs(module.learner, rows), logprobs(base, rows))  # the adapter is on
    assert module.learner.training  # the context restored train mode (it evaluates without dropout)


def test_refresh_merges_the_adapter_and_starts_a_fresh_one(tiny_model_dir, data_dir):
    torch.manual_seed(0)
    module = make_lora_module(tiny_model_dir, ref_refresh_every=2)
    trainer = fit(module, make_data(data_dir), steps=1)
    assert trainer.optimizers[0].state  # Adam moments of the adapter exist
    perturb_adapter(module)
    rows = batch_rows(module)
    learner_before = logprobs(module.learner, rows)
    a_before = [layer.lora_A["default"].weight.clone() for _, layer in lora_layers(module.learner)]
    params_before = [id(p) for p in module.learner.parameters()]

    module.refresh_reference()
    # the new reference (base with adapter merged) is the learner as it was, up to rounding of the merge
    torch.testing.assert_close(reference_logprobs(module, rows), learner_before, rtol=1e-5, atol=1e-5)
    # the learner equals its reference exactly: B = 0 adds exact zeros; the KL term restarts from zero
    torch.testing.assert_close(logprobs(module.learner, rows), reference_logprobs(module, rows), rtol=0, atol=0)
    layers = [layer for _, layer in lora_layers(module.learner)]
    assert all(not layer.lora_B["default"].weight.any() for layer in layers)
    assert all(not torch.equal(layer.lora_A["default"].weight, a) for layer, a in zip(layers, a_before))
    assert [id(p) for p in module.learner.parameters()] == params_before  # the optimizer's tensors, in place
    assert not trainer.optimizers[0].state  # the old adapter's Adam moments are gone
    assert module.policy.lora_merges == 1


def test_refresh_and_sync_on_schedule(tiny_model_dir, data_dir):
    """Right after a sync the engine samples from the merged learner; right after a refresh KL is zero."""
    seen = []

    class Probe(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            rows = batch_rows(module)
            seen.append((trainer.global_step, logprobs(module.learner, rows), reference_logprobs(module, rows),
                         logprobs(module.engine.model, rows)))

    torch.manual_seed(0)
    module = make_lora_module(tiny_model_dir, ref_refresh_every=2)
    fit(module, make_data(data_dir), steps=5, callbacks=[Probe()])
    assert [s[0] for s in seen] == list(range(5))
    for step, learner, reference, engine in seen[1:]:
        torch.testing.assert_close(engine, learner, rtol=1e-5, atol=1e-5)  # sync_every = 1, merged weights
        if step % 2 == 0:
            assert torch.equal(learner, reference), step  # right after a refresh
        else:
            assert torch.equal(reference, seen[step - 1][2]), step  # fixed between refreshes
    assert not torch.equal(seen[2][2], seen[0][2])  # the refresh at step 2 moved the reference


def parameter_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_held_parameter_memory_is_about_one_base_not_two(tiny_model_dir, tiny_lm):
    base = parameter_bytes(tiny_lm[0])
    lora_ratio = parameter_bytes(make_lora_module(tiny_model_dir)) / base
    full_ratio = parameter_bytes(make_module(tiny_model_dir)) / base
    assert 1.0 < lora_ratio < 1.2, lora_ratio  # base + the adapter
    assert full_ratio == pytest.approx(2.0), full_ratio  # learner + reference copy


def test_rollout_sync_does_not_change_the_learner(tiny_model_dir):
    module = make_lora_module(tiny_model_dir)
    perturb_adapter(module)
    before = {k: v.clone() for k, v in module.learner.state_dict().items()}
    module.rollout_loop.sync(version=0)
    assert all(torch.equal(v, before[k]) for k, v in module.learner.state_dict().items())
    rows = batch_rows(module)
    torch.testing.assert_close(logprobs(module.engine.model, rows), logprobs(module.learner, rows),
                               rtol=1e-5, atol=1e-5)


def _run(tiny_model_dir, data_dir, tmp_path, steps, ckpt_path=None, save_at=None, model_dir=None):
    torch.manual_seed(0)
    module = make_lora_module(model_dir or tiny_model_dir, ref_refresh_every=3,
                              rollout=RolloutConfig(k=3, sync_every=2, sampling=SamplingConfig(max_new_tokens=3)))
    return fit_resumable(module, data_dir, tmp_path, steps, ckpt_path, save_at)


def test_resume_continues_like_an_uninterrupted_run(tiny_model_dir, data_dir, tmp_path):
    full, full_dm, full_trainer = _run(tiny_model_dir, data_dir, tmp_path, 7, save_at=4)
    ckpt = tmp_path / "ckpt" / "epoch=0-step=4.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    assert not any(k.startswith("reference.") for k in saved["state_dict"])  # no second copy of the weights
    assert saved["ggpo"]["lora"]["merges"] == 1
    resumed, resumed_dm, resumed_trainer = _run(tiny_model_dir, data_dir, tmp_path, 7, ckpt_path=str(ckpt))
    assert resumed_trainer.global_step == full_trainer.global_step == 7
    for a, b in ((resumed.learner, full.learner), (resumed.engine.model, full.engine.model)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert resumed.policy.lora_merges == full.policy.lora_merges == 2
    assert resumed_dm.buffer.state_dict() == full_dm.buffer.state_dict()


def test_resume_against_another_base_names_both(tiny_model_dir, data_dir, tmp_path):
    _run(tiny_model_dir, data_dir, tmp_path, 2, save_at=2)
    other = tmp_path / "other-base"
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.01)
    model.save_pretrained(other)
    load_tokenizer(tiny_model_dir).save_pretrained(other)
    with pytest.raises(ValueError, match=rf"trained on base model '{tiny_model_dir}'.*loads '{other}'"):
        _run(tiny_model_dir, data_dir, tmp_path, 3, ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt"),
             model_dir=other)


def test_ggpo_eval_loads_a_lora_checkpoint_as_the_merged_learner(tiny_model_dir, data_dir, tmp_path):
    from ggpo_lightning.evaluation.accuracy import load_model

    module, _, _ = _run(tiny_model_dir, data_dir, tmp_path, 4, save_at=4)  # a refresh at step 3
    model, _ = load_model(tmp_path / "ckpt" / "epoch=0-step=4.ckpt")
    rows = batch_rows(module)
    torch.testing.assert_close(logprobs(model, rows), logprobs(module.learner, rows), rtol=1e-5, atol=1e-5)


def test_a_lora_checkpoint_does_not_resume_a_full_run(tiny_model_dir, data_dir, tmp_path):
    _run(tiny_model_dir, data_dir, tmp_path, 1, save_at=1)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0)
    with pytest.raises(ValueError, match="trained with model.lora but this run is configured without it"):
        trainer.fit(make_module(tiny_model_dir), datamodule=make_data(data_dir),
                    ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=1.ckpt"))


def test_the_adapter_config_is_the_same_file_in_every_process(tiny_model_dir, tmp_path):
    """peft keeps target_modules as a set and writes it in hash order, which changes with each process's string
    hashing: save_adapter sorts it, so an export and its checksum repeat."""
    from ggpo_lightning.models.lora import save_adapter

    module = make_lora_module(tiny_model_dir, lora=LoraSettings(r=4, alpha=8.0, target_modules=[
        "up_proj", "q_proj", "o_proj", "k_proj", "down_proj", "gate_proj", "v_proj"]))
    save_adapter(module.learner, tmp_path, str(tiny_model_dir))
    written = json.loads((tmp_path / "adapter_config.json").read_text())["target_modules"]
    assert written == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.mark.parametrize("refresh_every", [0, 2])
def test_both_exports_load_back_with_the_learners_logprobs(tiny_model_dir, data_dir, tmp_path, refresh_every):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ggpo_lightning.evaluation.accuracy import load_model
    from ggpo_lightning.models.export import write_folder

    torch.manual_seed(0)
    module = make_lora_module(tiny_model_dir, ref_refresh_every=refresh_every,
                              lora=LoraSettings(r=4, alpha=8.0, export_merged=True))
    fit(module, make_data(data_dir), steps=3)
    for target, write in module.exports(tmp_path).items():
        write_folder(target, write)
    rows = batch_rows(module)
    expected = logprobs(module.learner, rows)

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final_model")  # plain transformers
    torch.testing.assert_close(logprobs(merged, rows), expected, rtol=1e-5, atol=1e-5)
    base_path = json.loads((tmp_path / "final_adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base_path == (str(tmp_path / "final_adapter" / "base") if refresh_every else str(tiny_model_dir))
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), tmp_path / "final_adapter")
    torch.testing.assert_close(logprobs(adapted, rows), expected, rtol=1e-5, atol=1e-5)
    assert load_tokenizer(tmp_path / "final_adapter")("1+2=")["input_ids"] == module.tokenizer("1+2=")["input_ids"]
    shutil.rmtree(tmp_path / "final_model")  # a run exported without the merged model: ggpo eval takes the adapter
    evaluated, _ = load_model(tmp_path)
    torch.testing.assert_close(logprobs(evaluated, rows), expected, rtol=1e-5, atol=1e-5)


def test_gradient_checkpointing_gives_the_same_adapter_gradients(tiny_model_dir):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(1)  # the adapter's A is drawn at random
        module = make_lora_module(tiny_model_dir, gradient_checkpointing=checkpointing)
        perturb_adapter(module)
        rows = batch_rows(module)
        module.learner.zero_grad()
        sequence_logprobs(module.learner, *rows)[0].sum().backward()
        grads.append([p.grad.clone() for p in module.learner.parameters() if p.requires_grad])
    assert all(g is not None and g.abs().max() > 0 for g in grads[1])
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-8)


def test_target_modules_that_match_nothing_list_the_layers_found(tiny_model_dir):
    with pytest.raises(ValueError, match=r"\['qkv'\] match no module.*q_proj.*v_proj"):
        make_lora_module(tiny_model_dir, lora=LoraSettings(target_modules=["q_proj", "qkv"]))


def test_bad_lora_settings_are_reported_together_before_loading(tmp_path):
    with pytest.raises(ValueError) as err:
        GGPOModule(str(tmp_path / "missing"), verifier="numeric",
                   lora=LoraSettings(r=0, alpha=-1.0, dropout=1.0, target_modules=[]))
    for key in ("model.lora.r", "model.lora.alpha", "model.lora.dropout", "model.lora.target_modules"):
        assert key in str(err.value)
