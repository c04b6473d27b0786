"""SeparateVLLMEngine: vLLM in a child process; the same tokens as in-process, weight sync through shared memory,
a dead child named; and the placement settings' errors (those run without vLLM).

The ``vllm``-marked tests share one separate engine on the wide tiny model (see test_vllm_engine.py).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
from ggpo_lightning.rollouts.engine import RolloutEngine
from ggpo_lightning.rollouts.hf_engine import generate_responses
from ggpo_lightning.rollouts.vllm_engine import VLLMEngine
from ggpo_lightning.rollouts.vllm_separate import SeparateVLLMEngine

from test_vllm_engine import (applied_weights, check_a_sync_is_followed, lm, model_dir,  # noqa: F401 - fixtures
                              prompt_ids)

# ----------------------------------------------------------------------------- settings (no vLLM needed)


def vllm_config(**settings) -> RolloutConfig:
    return RolloutConfig(engine="vllm", **settings)


def placement_errors(config: RolloutConfig) -> list[str]:
    """The config's errors but the one saying vLLM is not installed (this test runs with and without it)."""
    return [e for e in config.errors() if "is not installed" not in e]


def test_the_separate_placement_with_its_device_is_valid_and_async_needs_it():
    assert placement_errors(vllm_config(vllm_placement="separate", schedule="async")) == []
    assert placement_errors(vllm_config(vllm_placement="separate", vllm_devices=[1])) == []
    [error] = placement_errors(vllm_config(schedule="async"))
    assert "model.rollout.schedule: async" in error and "model.rollout.vllm_placement: separate" in error


@pytest.mark.parametrize("settings,message", [
    ({"vllm_placement": "remote"}, "model.rollout.vllm_placement must be one of ['colocated', 'separate']"),
    ({"vllm_devices": [0]}, "model.rollout.vllm_devices places the separate vLLM engine; set "
                            "model.rollout.vllm_placement: separate"),
    ({"vllm_placement": "separate", "vllm_devices": [0, 1]}, "model.rollout.vllm_devices takes one GPU index"),
    ({"vllm_placement": "separate", "vllm_devices": [-1]}, "model.rollout.vllm_devices takes one GPU index"),
])
def test_bad_placement_settings_name_the_key(settings, message):
    [error] = placement_errors(vllm_config(**settings))
    assert message in error


def test_placement_settings_need_the_vllm_engine():
    errors = RolloutConfig(vllm_placement="separate", vllm_devices=[0]).errors()
    assert errors == ["model.rollout.vllm_placement is for model.rollout.engine: vllm; the engine is 'hf'",
                      "model.rollout.vllm_devices is for model.rollout.engine: vllm; the engine is 'hf'"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_devices_on_a_machine_without_cuda_are_an_error_before_any_process_starts(tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(ValueError, match=r"model.rollout.vllm_devices: \[0\] names GPUs, but this machine has no"):
        SeparateVLLMEngine("unused", tok, torch.float32, layout=model.state_dict(), devices=[0])


def test_devices_are_the_trainers_gpu_numbers_mapped_through_its_visible_devices(tiny_lm, monkeypatch):
    model, tok = tiny_lm
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    engine = SeparateVLLMEngine("unused", tok, torch.float32, layout=model.state_dict(), devices=[1])
    assert engine.visible_devices == "5" and engine.pid is None  # nothing started yet
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert SeparateVLLMEngine("unused", tok, torch.float32, layout={}, devices=[2]).visible_devices == "2"
    with pytest.raises(ValueError, match=r"model.rollout.vllm_devices: GPUs \[3\] do not exist here \(3 visible"):
        SeparateVLLMEngine("unused", tok, torch.float32, layout={}, devices=[3])


# ----------------------------------------------------------------------------- with vLLM


@pytest.fixture(scope="module")
def separate(model_dir):
    engine = SeparateVLLMEngine(str(model_dir), load_tokenizer(model_dir), torch.float32,
                                layout=load_causal_lm(model_dir, dtype="float32").state_dict(), record_logprobs=True,
                                engine_args={"max_model_len": 64})
    yield engine
    engine.close()


@pytest.mark.vllm
def test_it_samples_what_the_colocated_engine_samples_in_another_process(separate, lm, model_dir):
    """Greedy: the HF engine's tokens; sampled at a torch seed: the colocated engine's responses and log-probs
    (the seeds are drawn in this process)."""
    model, tok = lm
    prompts = prompt_ids(tok)
    assert isinstance(separate, RolloutEngine)
    assert [g.response_ids[0] for g in separate.greedy(prompts, 8)] == generate_responses(model, tok, prompts, 8,
                                                                                          do_sample=False)
    assert separate.pid is not None and separate.pid != os.getpid()
    sampling = SamplingConfig(temperature=1.5, max_new_tokens=6)
    torch.manual_seed(3)
    got = separate.generate(prompts, 4, sampling)
    colocated = VLLMEngine(str(model_dir), tok, torch.float32, record_logprobs=True, engine_args={"max_model_len": 64})
    torch.manual_seed(3)
    expected = colocated.generate(prompts, 4, sampling)
    del colocated
    gc.collect()
    assert [g.response_ids for g in got] == [g.response_ids for g in expected]
    assert any(len({tuple(r) for r in g.response_ids}) > 1 for g in got)  # K samples, not one sample K times
    for mine, theirs in zip(got, expected):
        assert mine.responses == theirs.responses
        for a, b in zip(mine.token_logprobs, theirs.token_logprobs):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


@pytest.mark.vllm
def test_a_sync_puts_the_learners_weights_in_the_child_and_greedy_follows(separate, lm, model_dir):
    separate.greedy([[5, 6]], 1)
    pid = separate.pid
    # the weights read in the child, on vLLM's worker
    check_a_sync_is_followed(separate, *lm, model_dir, lambda engine: engine.collective_rpc(applied_weights)[0])
    assert separate.pid == pid  # the same child: loaded through the shared buffers


@pytest.mark.vllm
def test_a_failure_in_the_child_comes_back_with_its_traceback(separate):
    with pytest.raises(RuntimeError, match=r"(?s)failed:\nTraceback.*prompt cannot be empty"):
        separate.greedy([[]], 4)  # vLLM refuses an empty prompt
    assert separate.greedy([[5, 6]], 1)[0].response_ids  # the child still serves


@pytest.mark.vllm
def test_a_dead_child_is_a_runtime_error_naming_its_pid_and_exit_code(separate):
    separate.greedy([[5, 6]], 1)  # started
    pid = separate.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"the vLLM engine process \(pid {pid}\) died, exit code -9"):
        separate.greedy([[5, 6]], 1)
    separate.close()
    separate.close()  # idempotent
    assert separate.pid is None


@pytest.mark.vllm
def test_a_start_up_failure_is_raised_at_start_with_the_childs_message(lm, model_dir):
    _, tok = lm
    engine = SeparateVLLMEngine(str(model_dir), tok, torch.float32, layout={}, engine_args={"seed": 1})
    with pytest.raises(RuntimeError, match=r"(?s)could not start the engine.*which the engine sets itself"):
        engine.greedy([[5, 6]], 1)
    assert engine.pid is None


@pytest.mark.vllm
def test_the_child_exits_when_the_trainer_is_killed(model_dir):
    """kill -9 of the parent closes the pipe: the idle child sees it and exits (no vLLM process left behind)."""
    code = (
        "import sys, time, torch\n"
        "from ggpo_lightning.models.loading import load_tokenizer\n"
        "from ggpo_lightning.rollouts.vllm_separate import SeparateVLLMEngine\n"
        f"folder = {str(model_dir)!r}\n"
        "engine = SeparateVLLMEngine(folder, load_tokenizer(folder), torch.float32, layout={},"
        " engine_args={'max_model_len': 64})\n"
        "engine.greedy([[5, 6]], 1)\n"
        "print('PID', engine.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        child = next(int(line.split()[1]) for line in parent.stdout if line.startswith("PID "))  # vLLM logs too
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child), f"the vLLM engine process {child} outlived its killed parent"


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan is reaped by init, but may linger as one briefly)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
