"""The settings of the vLLM server engine (``model.rollout.engine: vllm_server``): each error names its recipe key."""

from __future__ import annotations

import pytest

from ggpo_lightning.records.errors import SettingsError
from ggpo_lightning.rollouts.config import RolloutConfig
from ggpo_lightning.training.settings import check_model_settings


def test_server_settings_name_their_keys():
    assert RolloutConfig(engine="vllm_server", servers="local:2").errors() == []
    assert RolloutConfig(engine="vllm_server", servers="local:2").local_servers == 2
    assert RolloutConfig(engine="vllm_server", servers="local").local_servers == 1
    assert RolloutConfig(engine="vllm_server", servers=["http://a:8000"]).errors() == []
    assert "needs model.rollout.servers" in RolloutConfig(engine="vllm_server").errors()[0]
    assert "must be a list of URLs, local or local:N" in RolloutConfig(engine="vllm_server", servers="local:0").errors()[0]
    assert "servers[0] must be a URL" in RolloutConfig(engine="vllm_server", servers=["a:8000"]).errors()[0]
    # unused by the other engines (as vllm_args): --model.rollout.engine hf alone runs a server recipe without vLLM
    assert RolloutConfig(servers="local:4", server_devices=[4, 5, 6, 7], server_logprobs=False).errors() == []
    assert "in_flight_updates must be one of ['keep', 'drain']" in RolloutConfig(
        engine="vllm_server", servers="local", in_flight_updates="abort").errors()[0]
    assert RolloutConfig().in_flight_mode(uses_behavior_logp=True) == "drain"
    assert RolloutConfig().in_flight_mode(uses_behavior_logp=False) == "keep"


def test_server_logprobs_off_is_refused_for_an_objective_with_importance_ratios():
    rollout = {"engine": "vllm_server", "servers": "local", "server_logprobs": False}
    check_model_settings({"objective": {"name": "ggpo"}, "rollout": rollout})  # GGPO needs none
    for name in ("grpo", "oapl"):  # ratios, or a regression on log(pi / mu): both read the behavior's log-probs
        with pytest.raises(SettingsError, match=f"model.rollout.server_logprobs: false leaves {name} without the "
                                                "behavior log-probs it reads"):
            check_model_settings({"objective": {"name": name}, "rollout": rollout})


def test_server_keys_set_with_another_engine_are_named_in_one_warning():
    from ggpo_lightning.training.preflight import _warn_unused_server_keys

    hf = RolloutConfig(servers="local:4", server_devices=[4, 5, 6, 7], request_timeout=30.0)
    assert hf.unused_server_keys() == ["model.rollout.servers", "model.rollout.server_devices",
                                       "model.rollout.request_timeout"]
    assert RolloutConfig(engine="vllm", in_flight_updates="keep").unused_server_keys() == [
        "model.rollout.in_flight_updates"]
    assert RolloutConfig(in_flight_updates="keep").unused_server_keys() == []  # the HF engine emulates it
    assert RolloutConfig(engine="vllm_server", servers="local", request_timeout=30.0).unused_server_keys() == []
    with pytest.warns(UserWarning) as caught:
        _warn_unused_server_keys(hf)
    (warning,) = caught
    assert str(warning.message) == ("model.rollout.servers, model.rollout.server_devices, model.rollout.request_timeout "
                                    "apply to model.rollout.engine: vllm_server only; with engine: hf they are left "
                                    "unused")
