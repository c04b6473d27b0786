"""VLLMEngine: the same greedy tokens and log-probs as the learner, weight sync, selection and its errors.

The ``vllm``-marked tests need vLLM: ``make test-vllm`` runs them in the ``.venv-vllm``
environment (``scripts/setup-vllm-venv.sh``); elsewhere conftest skips them. They share one
float32 engine (building one takes seconds); the sync test puts the folder's weights back.
Their model is the tiny test model twice as wide (conftest's ``wide_tiny_model_dir``): vLLM's
CPU attention has no kernel for the test model's head size 16; 32 works.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from ggpo_lightning.cli.eval import eval_command
from ggpo_lightning.core.logprobs import pack_sequences, token_logprobs
from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine, generate_responses
from ggpo_lightning.rollouts.config import vllm_available
from ggpo_lightning.rollouts.vllm.engine import VLLMEngine

FP32_TOLERANCE = 1e-4
"""Largest |vLLM - learner| token log-prob difference accepted in float32 (different kernels, same math)."""

BF16_BOUND = 0.1
"""Largest |vLLM bf16 - learner fp32| token log-prob difference accepted (measured on this model: max 2.7e-2,
mean 3.6e-3 nats over ~80 tokens; bf16 keeps 8 significant bits, so a logit of size 10 moves by ~0.04)."""

PROMPTS = ["1+2=", "4+4=", "9+0=", "3+5=", "7+1=", "2+2=", "6+3=", "8+"]


# ----------------------------------------------------------------------------- without vLLM


@pytest.mark.skipif(vllm_available(), reason="checks the error when vLLM is missing")
def test_selecting_vllm_without_it_names_the_install_command(tiny_lm, tiny_model_dir):
    assert RolloutConfig(engine="vllm").errors() == []  # a valid recipe: the run's preflight says what is missing
    with pytest.raises(ImportError, match=r"ggpo-lightning\[vllm\]"):
        VLLMEngine(str(tiny_model_dir), tiny_lm[1], torch.float32)


@pytest.mark.skipif(vllm_available(), reason="checks the error when vLLM is missing")
def test_ggpo_eval_with_the_vllm_engine_without_it_names_the_install_command(tiny_model_dir, tmp_path):
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"problem": "1+2=", "answer": "3"}\n')
    result = CliRunner().invoke(eval_command, [str(tiny_model_dir), str(bench), "--engine", "vllm"])
    assert result.exit_code == 2 and "--engine vllm needs vLLM" in result.output
    assert "scripts/setup-vllm-venv.sh" in result.output


def test_ggpo_eval_vllm_args_need_the_vllm_engine(tiny_model_dir, tmp_path):
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"problem": "1+2=", "answer": "3"}\n')
    result = CliRunner().invoke(eval_command, [str(tiny_model_dir), str(bench), "--vllm-args", "{}"])
    assert result.exit_code == 2 and "--vllm-args is for --engine vllm" in result.output


@pytest.mark.vllm
@pytest.mark.parametrize("flags,message", [(["--vllm-args", "[64]"], "--vllm-args must be a JSON object"),
                                           (["--device", "cpu"], "--device is for --engine hf")])
def test_ggpo_eval_vllm_engine_flag_errors_name_the_flag(tiny_model_dir, tmp_path, flags, message):
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"problem": "1+2=", "answer": "3"}\n')
    result = CliRunner().invoke(eval_command, [str(tiny_model_dir), str(bench), "--engine", "vllm", *flags])
    assert result.exit_code == 2 and message in result.output


def test_engine_setting_errors_name_the_key():
    assert RolloutConfig(engine="hf").errors() == []
    [error] = RolloutConfig(engine="sglang").errors()
    assert "model.rollout.engine" in error and "'sglang'" in error
    # a vLLM recipe's engine arguments stay unused by the HF engine: --model.rollout.engine hf is its fallback
    assert RolloutConfig(vllm_args={"max_model_len": 64}).errors() == []


# ----------------------------------------------------------------------------- with vLLM


def prompt_ids(tok) -> list[list[int]]:
    return [tok(p)["input_ids"] for p in PROMPTS]


def learner_logprobs(model, prompts, responses, pad_id) -> list[torch.Tensor]:
    """The learner's token log-probs of each response (fp32, as the trainer computes them)."""
    ids, att, tgt = pack_sequences(prompts, responses, pad_id)  # [B, T], [B, T], [B, T]
    with torch.no_grad():
        tokens = token_logprobs(model, ids, att, tgt)  # [B, L]
    return [tokens[i][tgt[i]] for i in range(len(responses))]


def flat(generations) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    """(prompt of each response, responses, their recorded log-probs), flattened over groups."""
    prompts = [g.prompt_ids for g in generations for _ in g.response_ids]
    return prompts, [r for g in generations for r in g.response_ids], [lp for g in generations for lp in g.token_logprobs]


def applied_weights(worker) -> dict[str, torch.Tensor]:
    """vLLM's model's weights as its layers apply them, read on its ``worker`` (copies; for ``collective_rpc``,
    also in a separate engine's process, so defined at module level).

    On CPU vLLM packs each linear layer's weight for oneDNN and empties the parameter: such a
    weight is read back as ``layer(I)^T``, the identity in and the weight out.
    """
    weights = {}
    for name, module in worker.model_runner.model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor):
            continue
        if weight.numel() == 0 and hasattr(module, "cpu_linear"):
            eye = torch.eye(module.input_size, dtype=weight.dtype)  # [in, in]
            weight = module.cpu_linear(eye, weight, None).T  # [out, in]
        weights[f"{name}.weight"] = weight.detach().clone()
    return weights


def vllm_weights(engine: VLLMEngine) -> dict[str, torch.Tensor]:
    """vLLM's model's weights as its layers apply them (:func:`applied_weights`)."""
    return engine.llm.collective_rpc(applied_weights)[0]


def as_vllm_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers Llama state dict under vLLM's fused parameter names (q/k/v -> qkv_proj, gate/up -> gate_up_proj)."""
    fused = {}
    for name, value in state.items():
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            fused[name.replace("q_proj", "qkv_proj")] = torch.cat(
                [value, state[name.replace("q_proj", "k_proj")], state[name.replace("q_proj", "v_proj")]])
        elif ".gate_proj." in name:
            fused[name.replace("gate_proj", "gate_up_proj")] = torch.cat([value, state[name.replace("gate_proj", "up_proj")]])
        else:
            fused[name] = value
    return fused


@pytest.fixture(scope="module")
def model_dir(wide_tiny_model_dir):
    return wide_tiny_model_dir


@pytest.fixture()
def lm(model_dir):
    """``(learner, tokenizer)`` loaded fresh from ``model_dir`` in float32."""
    return load_causal_lm(model_dir, dtype="float32"), load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def fp32_engine(model_dir):
    engine = VLLMEngine(str(model_dir), load_tokenizer(model_dir), torch.float32, record_logprobs=True,
                        engine_args={"max_model_len": 64})
    engine.llm  # built here, not inside the first test's timing
    yield engine
    del engine
    gc.collect()


@pytest.mark.vllm
def test_greedy_tokens_are_the_hf_engines(fp32_engine, lm):
    model, tok = lm
    prompts = prompt_ids(tok)
    expected = generate_responses(model, tok, prompts, 8, do_sample=False)
    got = [g.response_ids[0] for g in fp32_engine.greedy(prompts, 8)]
    assert isinstance(fp32_engine, RolloutEngine)
    assert got == expected
    assert any(ids[-1] == tok.eos_token_id for ids in got)  # stops at EOS like the HF engine, EOS kept


@pytest.mark.vllm
def test_groups_are_seeded_from_torch_and_differ_within_a_group(fp32_engine, lm):
    _, tok = lm
    sampling = SamplingConfig(temperature=1.5, max_new_tokens=6)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(fp32_engine.generate(prompt_ids(tok), 4, sampling))
    same, again, other = ([g.response_ids for g in run] for run in runs)
    assert same == again and same != other
    assert any(len({tuple(r) for r in group}) > 1 for group in same)  # K samples, not one sample K times
    for g in runs[0]:
        assert len(g.response_ids) == len(g.responses) == len(g.token_logprobs) == 4
        for ids, text in zip(g.response_ids, g.responses):
            assert 1 <= len(ids) <= 6 and tok.eos_token_id not in ids[:-1]
            assert text == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.vllm
def test_recorded_logprobs_are_the_learners_at_temperature_1_in_fp32(fp32_engine, lm):
    """Sampled at temperature 1.5 and top-p 0.8: the recorded log-probs are still the raw model's (temperature 1,
    no top-p), as the HF engine's; processed log-probs would differ by far more than the tolerance."""
    model, tok = lm
    torch.manual_seed(0)
    prompts, responses, recorded = flat(fp32_engine.generate(prompt_ids(tok), 4,
                                                             SamplingConfig(temperature=1.5, top_p=0.8, max_new_tokens=6)))
    expected = learner_logprobs(model, prompts, responses, tok.pad_token_id)
    diff = torch.cat([torch.tensor(r) - e for r, e in zip(recorded, expected)]).abs()  # [all tokens]
    print(f"fp32 vLLM vs learner token log-probs: max |diff| {diff.max():.2e}, mean {diff.mean():.2e} "
          f"over {diff.numel()} tokens")
    assert [len(r) for r in recorded] == [len(r) for r in responses]
    assert diff.max() < FP32_TOLERANCE


def move_every_weight(model) -> None:
    """Add noise to each of ``model``'s weights (seeded: the same move every time), enough to change greedy decoding."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))


def check_a_sync_is_followed(engine, model, tok, model_dir, read_weights) -> None:
    """Perturb ``model`` and stream it into ``engine`` (as FSDP gathers it): vLLM's weights (``read_weights(engine)``,
    :func:`applied_weights`) are the learner's and greedy decoding follows; a stream missing a weight is a KeyError
    naming it. The folder's weights are put back after (the module form), for the other tests."""
    prompts = prompt_ids(tok)
    before = [g.response_ids[0] for g in engine.greedy(prompts, 8)]
    move_every_weight(model)
    engine.load_weights(iter(model.state_dict().items()), version=5)
    assert engine.version == 5
    loaded, expected = read_weights(engine), as_vllm_names(model.state_dict())
    assert expected.keys() <= loaded.keys()
    for name, value in expected.items():  # vLLM pads the vocabulary rows of embedding and head
        assert torch.equal(loaded[name][:len(value)], value), name
    after = [g.response_ids[0] for g in engine.greedy(prompts, 8)]
    assert after == generate_responses(model, tok, prompts, 8, do_sample=False)
    assert after != before  # the perturbation changed what greedy decoding says: the check above can fail

    state = dict(model.state_dict())
    del state["model.norm.weight"]
    with pytest.raises(KeyError, match="model.norm.weight"):
        engine.load_weights(state, version=6)
    assert engine.version == 5
    engine.load_weights(load_causal_lm(model_dir, dtype="float32"), version=0)


@pytest.mark.vllm
def test_a_sync_streams_the_learners_weights_and_generation_follows(fp32_engine, lm, model_dir):
    check_a_sync_is_followed(fp32_engine, *lm, model_dir, vllm_weights)


@pytest.mark.vllm
def test_a_stream_naming_the_tied_weight_once_still_moves_the_output_layer(fp32_engine, lm, model_dir):
    """``named_parameters()`` names the embedding shared with the output layer once (no ``lm_head.weight``, as in a
    ``save_pretrained`` folder): vLLM's output layer loads nothing, and it keeps multiplying with its packed copy of
    the old embedding unless the reload re-processes it (:func:`~ggpo_lightning.rollouts.vllm.reload.finish_reload`)."""
    model, tok = lm
    assert "lm_head.weight" in model.state_dict() and "lm_head.weight" not in dict(model.named_parameters())
    prompts = prompt_ids(tok)
    before = [g.response_ids[0] for g in fp32_engine.greedy(prompts, 8)]
    move_every_weight(model)
    fp32_engine.load_weights(model.named_parameters(), version=7)
    after = [g.response_ids[0] for g in fp32_engine.greedy(prompts, 8)]
    fp32_engine.load_weights(load_causal_lm(model_dir, dtype="float32"), version=0)  # for the other tests
    assert after == generate_responses(model, tok, prompts, 8, do_sample=False)
    assert after != before


@pytest.mark.vllm
def test_bf16_engine_logprobs_differ_from_the_fp32_learner_by_a_measured_amount(lm, model_dir):
    """The numerics mismatch setting: vLLM in bf16 against the fp32 learner, next to the HF engine in bf16."""
    model, tok = lm
    bf16 = VLLMEngine(str(model_dir), tok, torch.bfloat16, record_logprobs=True, engine_args={"max_model_len": 64})
    bf16.load_weights(model, version=1)  # the module form; cast to bf16 on the way in
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    hf = HFGenerateEngine(model, tok, dtype=torch.bfloat16, record_logprobs=True)
    diffs = {}
    for name, engine in (("vllm", bf16), ("hf", hf)):
        torch.manual_seed(0)
        prompts, responses, recorded = flat(engine.generate(prompt_ids(tok), 4, sampling))
        expected = learner_logprobs(model, prompts, responses, tok.pad_token_id)
        diffs[name] = torch.cat([torch.tensor(r) - e for r, e in zip(recorded, expected)]).abs()  # [all tokens]
        print(f"bf16 {name} engine vs fp32 learner token log-probs: max |diff| {diffs[name].max():.2e}, "
              f"mean {diffs[name].mean():.2e} over {diffs[name].numel()} tokens")
    assert diffs["vllm"].max() > FP32_TOLERANCE  # bf16 shows: the measured mismatch is real
    assert diffs["vllm"].max() < BF16_BOUND  # and bounded
    assert diffs["vllm"].mean() < 5 * diffs["hf"].mean() + 1e-2  # of the size of bf16's own rounding (HF engine's)


@pytest.mark.vllm
def test_ggpo_eval_with_the_vllm_engine_scores_as_the_hf_engine_without_lightning(model_dir, tmp_path):
    """Greedy: the same per-problem counts as the HF engine; sampled: a function of the seed (two copies of
    one benchmark, each sampled from the seed, score alike); and no Lightning imported."""
    problems = [{"problem": f"{a}+{b}=", "answer": str(a + b), "id": f"{a}+{b}"} for a in range(4) for b in range(4)]
    bench, again = tmp_path / "sums.jsonl", tmp_path / "again.jsonl"
    for path in (bench, again):
        path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    common = [str(model_dir), str(bench), "--verifier", "numeric", "--max-new-tokens", "4"]
    vllm = ["--engine", "vllm", "--vllm-args", json.dumps({"max_model_len": 64})]
    greedy_args = common + vllm + ["--json", str(tmp_path / "greedy.json")]
    sampled_args = common + [str(again), "--k", "4", "--temperature", "1", "--seed", "3", *vllm,
                             "--json", str(tmp_path / "sampled.json")]
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from ggpo_lightning.cli.eval import eval_command\n"
        f"for args in ({greedy_args!r}, {sampled_args!r}):\n"
        "    result = CliRunner().invoke(eval_command, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', "
        "'lightning_fabric')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"

    result = CliRunner().invoke(eval_command, common + ["--json", str(tmp_path / "hf.json")])
    assert result.exit_code == 0, result.output
    hf, greedy, sampled = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("hf", "greedy", "sampled"))
    assert greedy["settings"]["engine"] == "vllm" and hf["settings"]["engine"] == "hf"
    counts = [p["correct"] for p in hf["benchmarks"][0]["per_problem"]]
    print(f"ggpo eval greedy accuracy: hf {hf['average']['accuracy']:.3f}, vllm {greedy['average']['accuracy']:.3f}")
    assert 0 < sum(counts) < len(counts)  # some right, some wrong: the comparison can fail
    assert [p["correct"] for p in greedy["benchmarks"][0]["per_problem"]] == counts
    first, second = sampled["benchmarks"]
    assert first["per_problem"] == second["per_problem"] and first["k"] == 4
