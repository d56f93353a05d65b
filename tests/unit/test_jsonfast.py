"""``jsonfast`` gives the standard library's results exactly: the same values read, the same
bytes written, the same errors, on generated values and on the inputs the two libraries treat
differently (NaN, numbers past a double or past 64 bits, lone surrogates, duplicate keys)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezat_compat import jsonfast
from ezat_compat.jsonfast import encode_json
from ezat_compat.server.logs import access_line
from ezat_compat.translate.stream import encode_chunk

TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)  # surrogates included
SCALARS = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | TEXT
FLOAT_FREE = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4))
WITH_FLOATS = st.recursive(
    SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
)


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the same kind of error
        return ("error", UnicodeEncodeError if isinstance(exc, UnicodeEncodeError) else ValueError)


def compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@settings(max_examples=600, deadline=None)
@given(WITH_FLOATS)
def test_values_are_written_as_json_writes_them(value: Any) -> None:
    assert outcome(jsonfast.dumps_compact, value) == outcome(compact, value)


@settings(max_examples=300, deadline=None)
@given(FLOAT_FREE)
def test_float_free_values_are_written_as_json_writes_them_unchecked(value: Any) -> None:
    assert outcome(lambda v: jsonfast.dumps_compact(v, floats=False), value) == outcome(compact, value)


@pytest.mark.parametrize(
    "value",
    [
        1e-05,  # orjson: 0.00001
        -1.234e-05,  # orjson: -0.00001234
        1e-09,  # orjson: 1e-9
        -2.0602789827992783e-06,  # orjson: -2.0602789827992783e-6
        9.999999999999999e-05,
        0.0001,
        5e-324,
        1e-10,
        1e16,
        1.2345678901234568e17,
        1e22,
        -0.0,
        0.1,
        [{"temperature": 1.0, "top_p": 0.9, "minimum": 1e-07}],
        {"text": "0.00001 and e-5 in a string", "x": 1.5},
    ],
)
def test_the_floats_the_libraries_write_differently(value: Any) -> None:
    assert jsonfast.dumps_compact(value) == compact(value)


class _Refuses:
    def encode(self, value: Any) -> str:
        raise AssertionError("written again by json")


@pytest.mark.parametrize(
    "value",
    [
        {"id": "resp_019ad5ee-6c3f-7abc-8de1-0123456789ab"},  # e-6 inside a request id
        {"text": "re-7 of 12, one-1"},
        {"n": 1e-10, "m": 2.5e-300},  # two-digit exponents: both write them alike
        [0.0001, 12.5, 1e16],
    ],
)
def test_values_written_alike_are_not_written_twice(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonfast, "_COMPACT", _Refuses())
    assert jsonfast.dumps_compact(value) == compact(value)


@settings(max_examples=400, deadline=None)
@given(WITH_FLOATS)
def test_json_text_is_read_as_json_reads_it(value: Any) -> None:
    text = json.dumps(value)  # \\ud800 escapes, big integers, floats of every size
    assert repr(jsonfast.loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        '{"a":18446744073709551616}',  # past 64 bits: an int to json, a float to orjson
        '{"n":-0}',
        '{"x":1e400}',
        '{"x":NaN}',
        '{"x":-Infinity}',
        '"\\ud800"',
        '{"a":1,"a":2}',
        '{"t":"\\u2028\\u0000"}',
        " [1, 2.5e-7] ",
        "{oops",
        "",
        '{"a":1} x',
    ],
)
def test_inputs_the_libraries_read_differently(text: str) -> None:
    expected = outcome(json.loads, text)
    got = outcome(jsonfast.loads, text)
    if (
        expected[0] == "ok"
        and isinstance(expected[1], dict)
        and any(isinstance(v, float) and math.isnan(v) for v in expected[1].values())
    ):
        assert got[0] == "ok" and math.isnan(got[1]["x"])
    else:
        assert repr(got) == repr(expected)


@settings(max_examples=300, deadline=None)
@given(FLOAT_FREE)
def test_a_chunk_line_is_the_pure_encoders(value: Any) -> None:
    assert jsonfast.sse_data(value) == encode_chunk(value)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        TEXT,
        SCALARS | st.floats(min_value=0, max_value=1e9).map(lambda ms: round(ms, 3)),  # latency_ms, ttfb_ms
        max_size=8,
    )
)
def test_an_access_line_is_what_json_writes(fields: dict[str, Any]) -> None:
    assert access_line(fields) == json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(WITH_FLOATS)
def test_a_json_body_is_what_json_writes_a_lone_surrogate_escaped(value: Any) -> None:
    try:
        expected = compact(value)
    except UnicodeEncodeError:  # a lone surrogate from upstream: escaped, never a failure
        expected = json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode()
    assert encode_json(value) == expected


# Every form of number ``json`` reads (JSON's grammar plus Python's NaN and ±Infinity), around
# the boundaries of orjson's integers (-2**63 to 2**64 - 1) and of a double.
_EDGES = [0, 1, 10**18, 10**19, 10**20, 2**53, 2**63, 2**64, 2**70]
INTEGER_TEXTS = sorted(
    {
        f"{sign}{edge + delta}"
        for edge in _EDGES
        for delta in (-2, -1, 0, 1, 2)
        if edge + delta >= 0
        for sign in ("", "-")
    }
)
FLOAT_TEXTS = [
    *(
        f"{i}{tail}"
        for i in ("0", "-0", "1", "-1", "9223372036854775809", "-9223372036854775809")
        for tail in (
            ".0",
            ".5",
            "e0",
            "E0",
            "e+1",
            "E-1",
            ".25e2",
            "e400",
            "e-400",
        )
    ),
    "0.0",
    "-0.0",
    "0.1",
    "1e-05",
    "5e-324",
    "2.4e-324",
    "4.9e-325",
    "1.7976931348623157e308",
    "1.7976931348623158e308",  # rounds down to the largest double
    "1.7976931348623159e308",  # past it: inf to json, refused by orjson
    "-1.7976931348623159e308",
    "1e400",
    "-1e400",
    "9007199254740993.0",
    "123456789012345678901234567890.5",
    "1.00000000000000011102230246251565404236316680908203125",
    "NaN",
    "Infinity",
    "-Infinity",
]
NOT_JSON = ["-NaN", "+1", "01", "1.", ".5", "1e", "0x10", "- 1", "infinity", "nan", "1_000"]


@pytest.mark.parametrize("number", INTEGER_TEXTS + FLOAT_TEXTS + NOT_JSON)
def test_every_number_form_is_read_as_json_reads_it(number: str) -> None:
    for text in (number, f"[{number}]", f'{{"n":{number}}}', f'{{"n":[1,{number},"x"]}}'):
        expected, got = outcome(json.loads, text), outcome(jsonfast.loads, text)
        assert repr(got) == repr(expected), text  # an int's repr isn't a float's; NaN's is the same


@pytest.mark.parametrize("number", INTEGER_TEXTS + FLOAT_TEXTS)
def test_every_number_is_written_as_json_writes_it(number: str) -> None:
    value = json.loads(number)
    for wrapped in (value, [value], {"n": value, "m": None}):
        assert outcome(jsonfast.dumps_compact, wrapped) == outcome(compact, wrapped)
        assert encode_json(wrapped) == json.dumps(wrapped, separators=(",", ":")).encode()


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_EDGES).flatmap(lambda e: st.integers(min_value=-e - 3, max_value=e + 3)))
def test_integers_near_the_boundaries_are_read_as_json_reads_them(n: int) -> None:
    text = f'{{"n":{n}}}'
    assert repr(jsonfast.loads(text)) == repr(json.loads(text))
    assert jsonfast.dumps_compact({"n": n}) == compact({"n": n})


@pytest.mark.parametrize("value", [{"a": None, "b": 1.5}, [None, 0.001, 1e-05], {"n": None}])
def test_finite_values_with_nulls_are_orjsons_bytes_when_the_caller_vouches(
    value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = compact(value)
    if b"e-" not in expected:  # (orjson's other notation is still looked for)
        monkeypatch.setattr(jsonfast, "_COMPACT", _Refuses())
    assert jsonfast.dumps_compact(value, finite=True) == expected
