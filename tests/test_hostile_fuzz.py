"""Issue 13 acceptance: fuzzed config and rule files give exit 0 or 2, one line per problem, never a traceback.

``kvwatch check`` runs in-process through ``main()``; any exception other than the
ones it maps to exit codes fails the test with its traceback. Inputs are built from
the real key names (so validation gets past the top level) mixed with random keys,
random YAML values (timestamps, NaN, huge numbers, nesting, hostile strings) and raw
bytes (invalid YAML, non-UTF-8).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.cli import main
from kvwatch.config import Settings
from kvwatch.core.rules import default_rules_dir

SECTIONS = {name: list(f.annotation.model_fields) for name, f in Settings.model_fields.items()}
HOSTILE_TEXT = st.sampled_from([
    "", "0s", "-1s", "1e400", "nan", "5 minutes", "3650d", "http://u:p@h:1", "{", "}", "{x.__class__}",
    "<!channel>", "\x00\x1b[2J", "é" * 50, "x" * 5000, "2026-13-45", "notadate", "!!python/object:os.system",
    '{job="x"} or vector(1)', '{__name__="foo"}', "[1, 2", "*", "&anchor", "~",
])
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=30) | HOSTILE_TEXT | st.dates() | st.datetimes())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=10) | HOSTILE_TEXT, inner, max_size=4), max_leaves=12)


@st.composite
def configs(draw: st.DrawFn) -> object:
    doc: dict[object, object] = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "bogus"]), max_size=5, unique=True)):
        keys = SECTIONS.get(section, ["x"])
        sub = {k: draw(VALUES) for k in draw(st.lists(st.sampled_from([*keys, "nope"]), max_size=4, unique=True))}
        doc[section] = sub if draw(st.integers(0, 9)) else draw(VALUES)
    return doc if draw(st.integers(0, 19)) else draw(VALUES)


def _dump(doc: object) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return repr(doc)


RAW = st.binary(max_size=300) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))


def _check(tmp: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.strip(), "exit 2 without saying why"
        assert all(line.startswith("kvwatch: ") for line in err.strip().splitlines()), err


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith(("KVWATCH_", "SLACK_"))]:
        monkeypatch.delenv(k)


FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(doc=configs(), raw=RAW, use_raw=st.booleans())
def test_fuzzed_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, raw: bytes,
                             use_raw: bool) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_bytes(raw if use_raw else _dump(doc).encode("utf-8", "surrogatepass"))
    _check(tmp_path, ["check", "--config", str(cfg)], capsys)


@FUZZ
@given(env=st.dictionaries(st.sampled_from([f"KVWATCH_{s}_{k}".upper() for s, ks in SECTIONS.items() for k in ks]
                                           + ["SLACK_BOT_TOKEN", "KVWATCH_SELECTOR", "KVWATCH_PROMETHEUS_URL"]),
                           HOSTILE_TEXT.filter(lambda t: "\x00" not in t)
                           | st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20),
                           max_size=4))
def test_fuzzed_environment(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                            env: dict[str, str]) -> None:
    with monkeypatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        _check(tmp_path, ["check"], capsys)


BUNDLED = yaml.safe_load(next(default_rules_dir().glob("*.yaml")).read_text())
RULE_KEYS = ["id", "mode", "severity", "cause", "description", "for", "summary", "when", "triage", "bogus"]
LEAF_KEYS = ["signal", "fact", "stat", "arg", "op", "value", "ref", "over", "missing", "bogus"]


@st.composite
def rule_files(draw: st.DrawFn) -> object:
    """A bundled rule file with random rules, keys, leaves and templates replaced."""
    doc = {"version": draw(st.sampled_from([1, 1, 1, 2, "1", None])), "rules": [dict(r) for r in BUNDLED["rules"]]}
    rules = doc["rules"]
    for _ in range(draw(st.integers(1, 6))):
        rule = rules[draw(st.integers(0, len(rules) - 1))]
        key = draw(st.sampled_from(RULE_KEYS))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            rule[key] = draw(VALUES)
        elif choice == 1:
            rule.pop(key, None)
        elif choice == 2:  # templates: random text with braces and fields
            field = draw(st.sampled_from(["kv_usage.mean", "capacity_tokens", "window.kv_usage.p90", "x.__class__",
                                          "", "0", "kv_usage[0]", "for_minutes!r", "kv_usage.mean:{x}"]))
            text = draw(st.text(max_size=20)) + "{" + field + draw(st.sampled_from(["}", "", ":.0%}", ":99999}"]))
            rule[draw(st.sampled_from(["summary", "triage"]))] = text if draw(st.booleans()) else [text]
        else:  # a leaf with random keys and values
            leaf = {k: draw(VALUES) for k in draw(st.lists(st.sampled_from(LEAF_KEYS), max_size=5, unique=True))}
            rule["when"] = {draw(st.sampled_from(["all", "any", "not", "bogus"])): [leaf] if draw(st.booleans())
                            else leaf}
    return doc if draw(st.integers(0, 9)) else draw(VALUES)


@FUZZ
@given(doc=rule_files(), raw=RAW, use_raw=st.integers(0, 9))
def test_fuzzed_rule_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, raw: bytes,
                           use_raw: int) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(raw if use_raw == 0 else _dump(doc).encode("utf-8", "surrogatepass"))
    _check(tmp_path, ["check", "--rules", str(rules)], capsys)
