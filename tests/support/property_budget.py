"""How many examples a hypothesis test tries: its own count under CI, a tenth of it between two edits.

Under CI (the ``CI`` variable set) hypothesis loads its own ``ci`` profile (derandomized, no
example database) and each test runs the ``max_examples`` its ``@settings`` names (100 when it
names none). Elsewhere ``tests/conftest.py`` loads the ``dev`` profile below and scales each test's
own count down with ``dev_examples``, so ``pytest tests/unit`` takes seconds; what each test
asserts is the same. ``pytest --hypothesis-profile=ci`` (or ``=default``) runs every count in full
on a development machine too."""

from __future__ import annotations

from typing import Any

from hypothesis import settings

DEV_PROFILE = "dev"
DEV_SHARE = 10  # a tenth of each test's own count…
DEV_FLOOR = 10  # …but at least this many (or the test's own count when it names fewer)
THOROUGH_DEFAULT = 100  # hypothesis' default max_examples: a test that names no count runs this many under CI
_SCALED = "_ezat_examples_scaled"


def dev_examples(thorough: int) -> int:
    """The examples a test that runs ``thorough`` of them under CI tries in the ``dev`` profile."""
    return min(thorough, max(DEV_FLOOR, thorough // DEV_SHARE))


settings.register_profile(DEV_PROFILE, max_examples=dev_examples(THOROUGH_DEFAULT))


def load_dev_profile_unless_thorough(in_ci: bool) -> None:
    """Load the ``dev`` profile unless the run is CI's (``in_ci``, or hypothesis found the ``CI``
    variable and loaded its ``ci`` profile). Call it before any test module is imported: ``@given``
    and ``@settings`` take the profile loaded when they run."""
    if not in_ci and settings.default is not settings.get_profile("ci"):
        settings.load_profile(DEV_PROFILE)


def dev_profile_loaded() -> bool:
    """Whether the ``dev`` profile is the one loaded (``--hypothesis-profile`` may load another)."""
    return settings.default is settings.get_profile(DEV_PROFILE)


def scale_examples(test: Any) -> bool:
    """Give a ``@given`` test ``dev_examples`` of the ``max_examples`` its ``@settings`` names (its
    other settings stay); True when they were replaced. Call it for the ``dev`` profile only. Once
    per test: each parametrized item of a test shares its function, scaled the first time only;
    anything but a hypothesis test is left as it is. Hypothesis reads a test's settings from its
    ``_hypothesis_internal_use_settings`` at each run: should that change, nothing is scaled and
    tests/unit/test_property_budget.py fails."""
    test = getattr(test, "__func__", test)  # a method's function: its settings live there
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if not getattr(test, "is_hypothesis_test", False) or not isinstance(own, settings):
        return False
    if getattr(test, _SCALED, False) or own.max_examples <= DEV_FLOOR:
        return False
    test._hypothesis_internal_use_settings = settings(own, max_examples=dev_examples(own.max_examples))
    setattr(test, _SCALED, True)
    return True
