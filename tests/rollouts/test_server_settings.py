"""The settings of the vLLM server engine (``model.rollout.engine: vllm_server``): each error names its recipe key."""

from __future__ import annotations

from ggpo_lightning.rollouts.config import RolloutConfig


def test_server_settings_name_their_keys():
    assert RolloutConfig(engine="vllm_server", servers="local:2").errors() == []
    assert RolloutConfig(engine="vllm_server", servers="local:2").local_servers == 2
    assert RolloutConfig(engine="vllm_server", servers="local").local_servers == 1
    assert RolloutConfig(engine="vllm_server", servers=["http://a:8000"]).errors() == []
    assert "needs model.rollout.servers" in RolloutConfig(engine="vllm_server").errors()[0]
    assert "must be a list of URLs, local or local:N" in RolloutConfig(engine="vllm_server", servers="local:0").errors()[0]
    assert "servers[0] must be a URL" in RolloutConfig(engine="vllm_server", servers=["a:8000"]).errors()[0]
    assert "is for model.rollout.engine: vllm_server" in RolloutConfig(servers="local").errors()[0]
    assert "in_flight_updates must be one of ['keep', 'drain']" in RolloutConfig(
        engine="vllm_server", servers="local", in_flight_updates="abort").errors()[0]
    assert RolloutConfig().in_flight_mode(uses_behavior_logp=True) == "drain"
    assert RolloutConfig().in_flight_mode(uses_behavior_logp=False) == "keep"
