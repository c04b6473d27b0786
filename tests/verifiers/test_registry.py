"""Finding and building verifiers by name, class path and spec; error messages."""

from __future__ import annotations

import pytest

import ggpo_verifiers.registry as registry
from ggpo_verifiers import (
    ExactVerifier,
    MathVerifier,
    NumericVerifier,
    UnknownVerifierError,
    Verifier,
    available_verifiers,
    get_verifier,
    register_verifier,
)


class _Echo(Verifier):
    isolated = False

    def check(self, answer: str, gold: str) -> bool:
        return answer == gold


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_builtins_are_listed_with_their_source() -> None:
    found = available_verifiers()
    assert found["math"] == "ggpo_verifiers.math:MathVerifier"
    assert found["exact"] == "ggpo_verifiers.exact:ExactVerifier"
    assert found["numeric"] == "ggpo_verifiers.exact:NumericVerifier"
    assert list(found) == sorted(found)


def test_get_verifier_by_name_passes_arguments() -> None:
    verifier = get_verifier("math", timeout=2.5, workers=1, fallbacks=())
    assert type(verifier) is MathVerifier and verifier.name == "math"
    assert (verifier.timeout, verifier.workers, verifier.fallbacks) == (2.5, 1, ())


@pytest.mark.parametrize("class_path", ["numeric", "ggpo_verifiers.exact.NumericVerifier", "ggpo_verifiers.exact:NumericVerifier"])
def test_get_verifier_from_a_spec(class_path: str) -> None:
    spec = {"class_path": class_path, "init_args": {"rel_tol": 0.01, "abs_tol": 0.5}}
    verifier = get_verifier(spec, abs_tol=0.25)  # keyword arguments override init_args
    assert type(verifier) is NumericVerifier
    assert (verifier.rel_tol, verifier.abs_tol) == (0.01, 0.25)


def test_a_built_verifier_is_returned_as_is() -> None:
    verifier = ExactVerifier()
    assert get_verifier(verifier) is verifier
    with pytest.raises(TypeError, match="one or the other"):
        get_verifier(verifier, timeout=1.0)


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(UnknownVerifierError, match=r"unknown verifier 'mathh'; available: exact, math, numeric"):
        get_verifier("mathh")


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ({"init_args": {}}, ValueError, "needs 'class_path'"),
        ({"class_path": "math", "init_arg": {}}, ValueError, "init_arg"),
        ("collections.OrderedDict", TypeError, "not a concrete ggpo_verifiers.Verifier"),
        ("ggpo_verifiers.base.Verifier", TypeError, "not a concrete"),
        (42, TypeError, "from a int"),
    ],
)
def test_bad_specs_are_explained(spec: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        get_verifier(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "timeout=0"),
        ({"workers": 0}, "workers=0"),
        ({"memory_limit_mb": 10}, "memory_limit_mb=10"),
        ({"cache_size": -1}, "cache_size=-1"),
        ({"fallbacks": ["last_line"]}, "last_line"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_verifier("math", **kwargs)


def test_register_verifier(clean_registry) -> None:
    register_verifier("echo-test")(_Echo)
    assert available_verifiers()["echo-test"].endswith(":_Echo")
    verifier = get_verifier("echo-test")
    assert verifier.name == "echo-test" and verifier.score("a", "a") == 1.0
    register_verifier("echo-test")(_Echo)  # idempotent for the same class


def test_register_verifier_rejects_conflicts_and_bad_input(clean_registry) -> None:
    with pytest.raises(ValueError, match="already registered to ggpo_verifiers.math:MathVerifier"):
        register_verifier("math")(_Echo)
    with pytest.raises(ValueError, match="must be a letter"):
        register_verifier("two words")
    with pytest.raises(TypeError, match="not a Verifier subclass"):
        register_verifier("dict")(dict)  # type: ignore[type-var]


def test_verifier_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Verifier()  # type: ignore[abstract]
