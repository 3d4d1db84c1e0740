"""JSON from clients: what ``azqueue.model.jsontext`` accepts and refuses."""

from __future__ import annotations

import pytest

from azqueue.model import jsontext


def test_depth_counts_levels_of_arrays_and_objects() -> None:
    assert jsontext.checked_depth(1) == 0
    assert jsontext.checked_depth({"a": [1, {"b": []}]}) == 4
    assert jsontext.checked_depth([[], [[[]]], {}]) == 4


def test_as_deep_as_the_limit_is_accepted_and_one_more_level_refused() -> None:
    limit = jsontext.MAX_DEPTH
    assert jsontext.checked_depth(jsontext.loads("[" * limit + "]" * limit)) == limit
    with pytest.raises(ValueError, match=f"nested {limit + 1} levels deep; at most {limit}"):
        jsontext.loads("[" * (limit + 1) + "]" * (limit + 1))
    with pytest.raises(ValueError, match="at most 100 levels"):
        jsontext.loads("{\"a\":" * 100_000)  # past Python's own recursion limit


@pytest.mark.parametrize("text", ["1e999", "-1e999", "1E400", "NaN", "-Infinity",
                                  "9" * 309, "-" + "9" * 5000])
def test_numbers_a_reader_would_take_for_infinity_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="finite|not JSON"):
        jsontext.loads(f'{{"n": {text}}}')


@pytest.mark.parametrize(("text", "value"), [("1e308", 1e308), ("-2.5", -2.5),
                                             ("9" * 308, int("9" * 308))])
def test_large_finite_numbers_are_kept(text: str, value: object) -> None:
    assert jsontext.loads(text) == value


@pytest.mark.parametrize("text", [r'{"a": "\udc00"}', r'{"\ud800": 1}', r'["x\ud83d"]'])
def test_lone_surrogates_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        jsontext.loads(text)


def test_a_surrogate_pair_is_one_character() -> None:
    assert jsontext.loads(r'["\ud83d\ude00"]') == ["\U0001f600"]
