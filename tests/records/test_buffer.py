"""BehaviorBuffer and RolloutGroup: validation, draw policies, persistence, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ggpo_lightning.records import buffer as buffer_module
from ggpo_lightning.records.buffer import DRAW_POLICIES, BehaviorBuffer, RolloutGroup


def make_group(pid: str = "p0", k: int = 3, version: int = 0, rewards: list[float] | None = None,
               logprobs: bool = False, text: str = "1+1=?") -> RolloutGroup:
    response_ids = [[10 + i, 11, 2][: 1 + i % 3] for i in range(k)]  # ragged lengths 1, 2, 3, 1, ...
    return RolloutGroup(
        prompt_id=pid, prompt=text, gold="2", prompt_ids=[1, 5, 6],
        response_ids=response_ids, responses=[f"answer {i}" for i in range(k)],
        rewards=rewards if rewards is not None else [float(i % 2) for i in range(k)],
        behavior_version=version,
        behavior_logprobs=[[-0.5 - t for t in range(len(r))] for r in response_ids] if logprobs else None,
    )


def filled(n: int, **kwargs) -> BehaviorBuffer:
    buf = BehaviorBuffer(**kwargs)
    buf.add(make_group(f"p{i}", version=i) for i in range(n))
    return buf


def ids(groups: list[RolloutGroup]) -> list[str]:
    return [g.prompt_id for g in groups]


# ----------------------------------------------------------------------------- RolloutGroup


@pytest.mark.parametrize("logprobs", [False, True])
def test_group_dict_round_trip_with_unicode(logprobs):
    group = make_group("π-7 🧮", k=4, logprobs=logprobs, text="Combien font 2×3 ? 答え:")
    data = json.loads(json.dumps(group.to_dict()))
    assert RolloutGroup.from_dict(data) == group
    assert (data["behavior_logprobs"] is None) is (not logprobs)


def test_group_normalizes_tuples_and_numbers_and_to_dict_copies():
    group = RolloutGroup("p", "q", "a", (1, 2), ((3,), (4, 5)), ("x", "y"), (1, 0),
                         behavior_version=2, behavior_logprobs=((-1,), (-0.5, -2)))
    assert group.rewards == [1.0, 0.0] and all(type(r) is float for r in group.rewards)
    assert group.response_ids == [[3], [4, 5]] and group.behavior_logprobs == [[-1.0], [-0.5, -2.0]]
    data = group.to_dict()
    data["response_ids"][0].append(99)
    assert group.response_ids[0] == [3]


def test_group_k_and_mixed():
    assert make_group(k=5).k == 5
    assert make_group(rewards=[1.0, 0.0, 1.0]).mixed
    assert not make_group(rewards=[1.0, 1.0, 1.0]).mixed
    assert not make_group(k=1, rewards=[1.0]).mixed


def test_groups_define_no_ordering():
    # Nothing may sort or heap groups by reward: ties are the norm with binary rewards.
    a, b = make_group("a"), make_group("b")
    with pytest.raises(TypeError):
        _ = a < b


def good_fields(**changes) -> dict:
    data = make_group("bad-one", k=2, logprobs=True).to_dict()
    data.update(changes)
    return data


@pytest.mark.parametrize("changes, field", [
    ({"response_ids": [], "responses": [], "rewards": [], "behavior_logprobs": None}, "response_ids"),
    ({"responses": ["only one"]}, "responses"),
    ({"rewards": [1.0, 0.0, 1.0]}, "rewards"),
    ({"rewards": [1.0, float("nan")]}, "rewards[1]"),
    ({"rewards": [float("inf"), 0.0]}, "rewards[0]"),
    ({"rewards": ["1", 0.0]}, "rewards[0]"),
    ({"rewards": [True, 0.0]}, "rewards[0]"),
    ({"behavior_logprobs": [[-1.0]]}, "behavior_logprobs"),
    ({"behavior_logprobs": [[-1.0], [-1.0]]}, "behavior_logprobs[1]"),  # response 1 has 2 tokens
    ({"response_ids": [[10], [-1, 11]]}, "response_ids[1][0]"),
    ({"prompt_ids": [1, 2.5]}, "prompt_ids[1]"),
    ({"prompt_ids": "1 2 3"}, "prompt_ids"),
    ({"responses": ["a", 7]}, "responses[1]"),
    ({"behavior_version": -1}, "behavior_version"),
    ({"behavior_version": True}, "behavior_version"),
    ({"gold": 2}, "gold"),
])
def test_group_validation_names_field_and_prompt_id(changes, field):
    with pytest.raises(ValueError) as err:
        RolloutGroup.from_dict(good_fields(**changes))
    assert field in str(err.value) and "'bad-one'" in str(err.value)


def test_from_dict_missing_and_unknown_fields():
    data = good_fields()
    del data["gold"]
    with pytest.raises(ValueError, match=r"'bad-one'.*missing field\(s\) gold"):
        RolloutGroup.from_dict(data)
    with pytest.raises(ValueError, match=r"unknown field\(s\) reward\b"):
        RolloutGroup.from_dict(good_fields(reward=1.0))
    with pytest.raises(ValueError, match="must be a JSON object"):
        RolloutGroup.from_dict([1, 2])
    optional = good_fields()
    del optional["behavior_logprobs"]
    assert RolloutGroup.from_dict(optional).behavior_logprobs is None


# ----------------------------------------------------------------------------- settings and add


@pytest.mark.parametrize("kwargs, message", [
    ({"capacity": 0}, "capacity must be None .* or an int >= 1"),
    ({"draw": "lifo"}, "draw must be one of 'fifo', 'newest', 'uniform', got 'lifo'"),
    ({"max_staleness": -1}, "max_staleness must be None .* or an int >= 0"),
    ({"seed": "0"}, "seed must be an int"),
])
def test_bad_settings_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BehaviorBuffer(**kwargs)


@pytest.mark.parametrize("n", [0, -1, 1.5])
def test_draw_needs_a_positive_int(n):
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        filled(3).draw(n, current_version=0)


def test_add_rejects_non_groups_without_storing_any():
    buf = BehaviorBuffer()
    with pytest.raises(TypeError, match="wrap a single group"):
        buf.add(make_group())
    with pytest.raises(TypeError, match="item 1 is a dict"):
        buf.add([make_group(), make_group().to_dict()])
    assert len(buf) == 0


def test_capacity_evicts_oldest_and_counts():
    buf = filled(5, capacity=3)
    assert ids(buf.groups()) == ["p2", "p3", "p4"]
    buf.add([make_group("p5")])
    assert ids(buf.groups()) == ["p3", "p4", "p5"]
    stats = buf.stats()
    assert (stats["size"], stats["added"], stats["evicted"]) == (3.0, 6.0, 3.0)


def test_groups_returns_a_copy():
    buf = filled(3)
    buf.groups().clear()
    assert len(buf) == 3


# ----------------------------------------------------------------------------- draw policies


def test_fifo_consumes_oldest_first_and_returns_what_there_is():
    buf = filled(5)
    assert ids(buf.draw(2, current_version=9)) == ["p0", "p1"]
    assert ids(buf.draw(2, current_version=9)) == ["p2", "p3"]
    assert ids(buf.draw(2, current_version=9)) == ["p4"]  # fewer than n: the caller refills
    assert buf.draw(2, current_version=9) == [] and len(buf) == 0
    assert buf.stats()["drawn"] == 5.0


def test_newest_consumes_newest_first_and_keeps_the_rest():
    buf = filled(5, draw="newest")
    assert ids(buf.draw(2, current_version=9)) == ["p4", "p3"]
    assert ids(buf.groups()) == ["p0", "p1", "p2"]
    buf.add([make_group("p5", version=5)])
    assert ids(buf.draw(2, current_version=9)) == ["p5", "p2"]


def test_uniform_keeps_groups_and_covers_each_once_per_pass():
    buf = filled(12, draw="uniform", seed=3)
    draws = [ids(buf.draw(4, current_version=20)) for _ in range(9)]  # 3 passes of 3 draws
    assert len(buf) == 12
    for p in range(3):
        seen = sum(draws[3 * p: 3 * p + 3], [])
        assert sorted(seen) == sorted(f"p{i}" for i in range(12))
    assert draws[:3] != draws[3:6]  # each pass is a fresh permutation
    assert buf.stats()["passes"] == 3.0


def test_uniform_never_repeats_within_a_draw_across_a_pass_boundary():
    buf = filled(5, draw="uniform", seed=0)
    all_draws = []
    for _ in range(40):  # 5 groups, draws of 3: passes end mid-draw most of the time
        drawn = ids(buf.draw(3, current_version=0))
        assert len(set(drawn)) == 3
        all_draws += drawn
    # 120 draws = 24 full passes: every group exactly 24 times.
    assert Counter(all_draws) == {f"p{i}": 24 for i in range(5)}


def test_uniform_with_n_above_size_cycles_through_passes():
    buf = filled(3, draw="uniform")
    drawn = ids(buf.draw(8, current_version=0))
    assert len(drawn) == 8
    assert sorted(drawn[:3]) == sorted(drawn[3:6]) == ["p0", "p1", "p2"]
    assert BehaviorBuffer(draw="uniform").draw(4, current_version=0) == []


def test_uniform_is_deterministic_by_seed():
    def sequence(seed):
        buf = filled(10, draw="uniform", seed=seed)
        return [ids(buf.draw(3, current_version=0)) for _ in range(7)]
    assert sequence(1) == sequence(1)
    assert sequence(1) != sequence(2)


def test_uniform_groups_added_mid_pass_join_it_and_removed_ones_leave():
    buf = filled(6, draw="uniform", capacity=6, seed=5)
    first = ids(buf.draw(2, current_version=0))
    buf.add([make_group("new0"), make_group("new1")])  # evicts p0, p1
    # The rest of this pass: the survivors not drawn yet, plus the newcomers.
    due = {"p2", "p3", "p4", "p5", "new0", "new1"} - set(first)
    rest = [ids(buf.draw(1, current_version=0))[0] for _ in range(len(due))]
    assert sorted(rest) == sorted(due)
    assert buf.stats()["passes"] == 1.0
    buf.draw(1, current_version=0)
    assert buf.stats()["passes"] == 2.0


def test_max_staleness_drops_and_counts_before_drawing():
    buf = filled(6, max_staleness=2)  # versions 0..5
    drawn = buf.draw(10, current_version=5)  # staleness 5,4,3 dropped; 2,1,0 kept
    assert ids(drawn) == ["p3", "p4", "p5"]
    stats = buf.stats()
    assert stats["dropped_stale"] == 3.0
    assert (stats["staleness_mean"], stats["staleness_max"]) == (1.0, 2.0)


def test_max_staleness_applies_to_uniform_and_newer_groups_are_kept():
    buf = filled(4, draw="uniform", max_staleness=0)  # versions 0..3
    drawn = ids(buf.draw(4, current_version=2))
    # p0, p1 are stale; p3 is newer than current_version (an offline file of a longer run): kept.
    assert Counter(drawn) == {"p2": 2, "p3": 2}
    assert ids(buf.groups()) == ["p2", "p3"] and buf.stats()["dropped_stale"] == 2.0


def test_stats_are_floats_with_zero_staleness_before_any_draw():
    stats = filled(2).stats()
    assert all(type(v) is float for v in stats.values())
    assert stats["staleness_mean"] == stats["staleness_max"] == 0.0


@pytest.mark.parametrize("draw", DRAW_POLICIES)
def test_tied_rewards_and_identical_groups_are_fine(draw):
    # All-equal rewards everywhere, and groups equal field by field: nothing compares them.
    buf = BehaviorBuffer(draw=draw, capacity=50)
    buf.add(make_group("same", rewards=[1.0, 1.0, 1.0]) for _ in range(30))
    buf.add(make_group("same", rewards=[0.0, 0.0, 0.0]) for _ in range(30))
    drawn = buf.draw(25, current_version=0)
    assert len(drawn) == 25 and all(not g.mixed for g in drawn)


# ----------------------------------------------------------------------------- resume


def interleaved_run(buf: BehaviorBuffer, steps: range) -> list[list[str]]:
    """Adds and draws, as an online run does; returns the drawn prompt ids per step."""
    out = []
    for step in steps:
        if step % 3 == 0:
            buf.add(make_group(f"s{step}-{j}", version=step) for j in range(2))
        out.append(ids(buf.draw(3, current_version=step)))
    return out


@pytest.mark.parametrize("draw", DRAW_POLICIES)
def test_state_dict_through_json_resumes_the_same_draws(draw):
    settings = dict(capacity=9, draw=draw, max_staleness=6, seed=11)
    buf = filled(7, **settings)
    interleaved_run(buf, range(0, 10))  # mid-pass for uniform
    state = json.loads(json.dumps(buf.state_dict()))
    resumed = BehaviorBuffer(**settings)
    resumed.load_state_dict(state)
    assert resumed.stats() == buf.stats() and resumed.groups() == buf.groups()
    assert interleaved_run(resumed, range(10, 40)) == interleaved_run(buf, range(10, 40))
    assert resumed.stats() == buf.stats()


def test_load_state_dict_keeps_own_settings_and_evicts_beyond_capacity():
    state = filled(5, draw="uniform").state_dict()
    small = BehaviorBuffer(capacity=2)
    small.load_state_dict(state)
    assert ids(small.groups()) == ["p3", "p4"] and small.stats()["evicted"] == 3.0
    assert ids(small.draw(1, current_version=9)) == ["p3"]  # fifo: its own policy


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.update(format="other"), "not a behavior buffer"),
    (lambda s: s.update(format_version=99), "unsupported format_version 99"),
    (lambda s: s.pop("rng"), "missing key 'rng'"),
    (lambda s: s.update(rng=[3, [1, 2], None]), r"state_dict\['rng'\]"),
    (lambda s: s.update({"pass": [0, 0]}), r"state_dict\['pass'\]"),
    (lambda s: s["groups"][1].pop("rewards"), r"state_dict\['groups'\]\[1\].*missing field\(s\) rewards"),
    (lambda s: s.update(counters={"added": 1}), r"state_dict\['counters'\]"),
])
def test_load_state_dict_rejects_bad_state_and_changes_nothing(mutate, message):
    state = filled(3, draw="uniform").state_dict()
    mutate(state)
    buf = filled(1)
    with pytest.raises(ValueError, match=message):
        buf.load_state_dict(state)
    assert ids(buf.groups()) == ["p0"]


# ----------------------------------------------------------------------------- JSONL files


def test_jsonl_round_trip_with_unicode_and_optional_logprobs(tmp_path):
    buf = BehaviorBuffer()
    buf.add([make_group("α", logprobs=True, text="Solve: ∑ 𝑥 = 3 — réponse ?"),
             make_group("β", logprobs=False, version=4)])
    path = tmp_path / "runs" / "buffer.jsonl"  # parent is created
    buf.save_jsonl(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"format": "ggpo-behavior-buffer", "format_version": 1}
    assert "∑" in lines[1]  # stored as UTF-8 text, not \u escapes
    loaded = BehaviorBuffer.load_jsonl(path, draw="uniform", capacity=10)
    assert loaded.groups() == buf.groups()
    assert loaded.draw_policy == "uniform" and loaded.capacity == 10


def test_jsonl_without_header_with_blank_lines_and_concatenated_files(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    filled(2).save_jsonl(a)
    b.write_text("\n" + json.dumps(make_group("plain").to_dict()) + "\n\n", encoding="utf-8")
    both = tmp_path / "both.jsonl"
    both.write_text(a.read_text(encoding="utf-8") * 2 + b.read_text(encoding="utf-8"), encoding="utf-8")
    assert ids(BehaviorBuffer.load_jsonl(b).groups()) == ["plain"]
    assert ids(BehaviorBuffer.load_jsonl(both).groups()) == ["p0", "p1", "p0", "p1", "plain"]


def test_empty_buffer_round_trips(tmp_path):
    BehaviorBuffer().save_jsonl(tmp_path / "empty.jsonl")
    assert len(BehaviorBuffer.load_jsonl(tmp_path / "empty.jsonl")) == 0


GOOD_LINE = json.dumps(make_group("ok").to_dict())


def bad_record(**changes) -> str:
    data = make_group("broken").to_dict()
    data.update(changes)
    return json.dumps({k: v for k, v in data.items() if v != "DROP"})


@pytest.mark.parametrize("bad_line, message", [
    ('{"prompt_id": "x", ', "Expecting"),
    (bad_record(rewards="DROP"), r"missing field\(s\) rewards"),
    (bad_record(behavior_version="3"), "behavior_version must be an int"),
    (bad_record(rewards=[1, 0, "NaN"]), r"rewards\[2\] must be a finite number"),
    ('{"prompt_id": "x", "rewards": [NaN]}', "missing field"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"format": "ggpo-behavior-buffer", "format_version": 2}', "unsupported format_version 2"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join([GOOD_LINE, "", bad_line, GOOD_LINE]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        BehaviorBuffer.load_jsonl(path)
    assert str(err.value).startswith(f"{path}:3: ")


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD_LINE.encode() + b"\n" + b'{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match="utf-8") as err:
        BehaviorBuffer.load_jsonl(path)
    assert str(err.value).startswith(f"{path}:2: ")


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        BehaviorBuffer.load_jsonl(tmp_path / "nope.jsonl")


@pytest.fixture
def saved(tmp_path) -> Path:
    path = tmp_path / "buffer.jsonl"
    filled(2).save_jsonl(path)
    return path


def test_save_failing_mid_write_leaves_old_file_and_no_temp(saved, monkeypatch):
    before = saved.read_bytes()
    real_dumps, calls = json.dumps, []

    def flaky_dumps(obj, **kwargs):
        calls.append(obj)
        if len(calls) == 3:  # header and first group written, then fail
            raise RuntimeError("disk on fire")
        return real_dumps(obj, **kwargs)

    monkeypatch.setattr(buffer_module.json, "dumps", flaky_dumps)
    with pytest.raises(RuntimeError, match="disk on fire"):
        filled(5).save_jsonl(saved)
    assert saved.read_bytes() == before
    assert os.listdir(saved.parent) == [saved.name]


def test_save_failing_at_replace_leaves_old_file_and_no_temp(saved, monkeypatch):
    before = saved.read_bytes()

    def broken_replace(src, dst):
        raise OSError("replace failed")

    monkeypatch.setattr(buffer_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="replace failed"):
        filled(5).save_jsonl(saved)
    assert saved.read_bytes() == before
    assert os.listdir(saved.parent) == [saved.name]


def test_buffer_imports_without_torch():
    code = ("import sys, ggpo_lightning.records.buffer; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
