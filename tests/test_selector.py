"""The user's PromQL label selector: parsing, escaping, round-trip and errors naming where."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.core.selector import Matcher, parse_selector, render_matchers
from kvwatch.errors import ConfigError, SelectorError

LABELS = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True)
# any text PromQL can hold in a double-quoted string (no NUL; surrogates are not valid UTF-8)
VALUES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
MATCHERS = st.lists(st.builds(Matcher, LABELS, st.sampled_from(["=", "!="]), VALUES), max_size=4)


@settings(max_examples=60)
@given(MATCHERS, st.booleans())
def test_render_then_parse_round_trips(matchers: list[Matcher], braces: bool) -> None:
    text = render_matchers(tuple(matchers))
    if braces:
        text = "{" + text + "}"
    assert parse_selector(text) == tuple(matchers)


@settings(max_examples=60)
@given(MATCHERS)
def test_rendered_values_are_single_line_and_closed(matchers: list[Matcher]) -> None:
    text = render_matchers(tuple(matchers))
    assert "\n" not in text
    # every value sits in one pair of unescaped quotes: the count of bare quotes is even
    bare = text.replace("\\\\", "").replace('\\"', "")
    assert bare.count('"') == 2 * len(matchers)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, ()),
        ("", ()),
        ("{}", ()),
        ("  { }  ", ()),
        ('{namespace="llm"}', (Matcher("namespace", "=", "llm"),)),
        ('namespace="llm", pod=~"vllm-.*"', (Matcher("namespace", "=", "llm"), Matcher("pod", "=~", "vllm-.*"))),
        ("{a!='x', b!~`c\\d`}", (Matcher("a", "!=", "x"), Matcher("b", "!~", "c\\d"))),
        ('{a="q\\"uote\\\\back\\nnl"}', (Matcher("a", "=", 'q"uote\\back\nnl'),)),
        ('{a="x",}', (Matcher("a", "=", "x"),)),
        ('{ a = "1" , b="2" }', (Matcher("a", "=", "1"), Matcher("b", "=", "2"))),
        ('{a="ü, }"}', (Matcher("a", "=", "ü, }"),)),
    ],
)
def test_parse_accepts_promql_forms(text: str | None, expected: tuple[Matcher, ...]) -> None:
    assert parse_selector(text) == expected


def test_render_escapes_quotes_backslashes_and_newlines() -> None:
    m = Matcher("team", "=", 'a"b\\c\nd')
    assert m.render() == 'team="a\\"b\\\\c\\nd"'


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{a="b"', "does not close"),
        ('{a="b}', "unterminated"),
        ("{a=b}", "expected a quoted value"),
        ('{1a="b"}', "expected label matcher"),
        ('{a=="b"}', "expected a quoted value"),
        ('{a="b" c="d"}', "expected ','"),
        ('{a=~"("}', "invalid regex"),
        ('{a~"b"}', "expected label matcher"),
    ],
)
def test_syntax_errors_name_where_and_what(text: str, fragment: str) -> None:
    with pytest.raises(SelectorError) as err:
        parse_selector(text, "config.yaml: discovery.selector")
    assert isinstance(err.value, ConfigError)  # the CLI maps it to exit 2
    msg = str(err.value)
    assert msg.startswith("config.yaml: discovery.selector")
    assert fragment in msg
