"""The examples hypothesis tests try: each test's own count under CI, a tenth of it (at least 10)
between two edits (``tests/support/property_budget.py``, applied by ``tests/conftest.py``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import IN_CI
from tests.support.property_budget import DEV_PROFILE, dev_examples, scale_examples


@pytest.mark.parametrize(
    ("thorough", "dev"),
    [(600, 60), (400, 40), (300, 30), (150, 15), (100, 10), (50, 10), (10, 10), (5, 5), (1, 1)],
)
def test_a_tenth_of_the_examples_at_least_ten_never_more_than_the_test_names(thorough: int, dev: int) -> None:
    assert dev_examples(thorough) == dev


def examples_of(test: Any) -> int:
    """The ``max_examples`` a ``@given`` test runs with."""
    return int(test._hypothesis_internal_use_settings.max_examples)


def counted(max_examples: int) -> tuple[Any, list[int]]:
    runs: list[int] = []

    @settings(max_examples=max_examples, deadline=None, database=None)
    @given(st.integers())
    def check(n: int) -> None:
        runs.append(n)

    return check, runs


def test_a_property_tries_its_share_once_scaled() -> None:
    check, runs = counted(300)
    assert scale_examples(check)
    assert examples_of(check) == 30
    check()
    assert 0 < len(runs) <= 30


def test_the_other_settings_of_a_property_stay() -> None:
    check, _ = counted(300)
    scale_examples(check)
    kept = check._hypothesis_internal_use_settings
    assert kept.deadline is None and kept.database is None


def test_a_property_is_scaled_once_whatever_its_parametrized_items() -> None:
    check, _ = counted(600)
    assert scale_examples(check) and not scale_examples(check)
    assert examples_of(check) == 60


def test_a_property_of_ten_examples_or_fewer_keeps_them() -> None:
    check, _ = counted(7)
    assert not scale_examples(check)
    assert examples_of(check) == 7


class Properties:
    @settings(max_examples=200, database=None)
    @given(st.integers())
    def test_method(self, n: int) -> None:
        assert isinstance(n, int)


def test_a_method_is_scaled_through_its_function() -> None:
    assert scale_examples(Properties().test_method)
    assert examples_of(Properties.test_method) == 20


def test_a_test_without_hypothesis_is_left_alone() -> None:
    def plain() -> None:
        pass

    assert not scale_examples(plain) and not scale_examples(None)


def test_the_session_runs_the_dev_profile_unless_ci_or_asked(request: pytest.FixtureRequest) -> None:
    asked = request.config.getoption("hypothesis_profile")
    expected = asked or ("ci" if IN_CI or "CI" in os.environ else DEV_PROFILE)
    assert settings.default is settings.get_profile(expected)


@settings(max_examples=300, database=None)
@given(st.integers())
def test_a_collected_property_naming_300_examples(n: int) -> None:
    assert isinstance(n, int)


def test_the_suite_scales_the_properties_it_collects(request: pytest.FixtureRequest) -> None:
    if not request.session.items or test_a_collected_property_naming_300_examples.__name__ not in {
        item.name for item in request.session.items
    }:
        pytest.skip("only when the property above is collected too")
    dev = settings.default is settings.get_profile(DEV_PROFILE)
    assert examples_of(test_a_collected_property_naming_300_examples) == (30 if dev else 300)
