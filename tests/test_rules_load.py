"""Rule files: validated and compiled at load; every problem names file → rule → key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.core.models import FailureMode
from kvwatch.core.rules import SIGNAL_NAMES, default_rules_dir, load_rule_file, load_ruleset
from kvwatch.errors import ConfigError

GOOD = """\
version: 1
rules:
  - id: my-full
    mode: full
    severity: critical
    for: 5m
    summary: "KV at {kv_usage.mean:.0%}, {waiting.mean:.1f} waiting"
    when:
      all:
        - {signal: kv_usage, stat: frac_above, arg: 0.9, op: ">=", value: 0.8}
        - any:
            - {signal: waiting, stat: mean, op: ">=", value: 1}
            - not: {signal: preemptions, stat: mean, op: "<=", value: 0}
        - {fact: group_size, op: ">=", value: 1}
        - {signal: ttft_p99, stat: median, op: ">", ref: ttft_slo, over: window}
    triage:
      - "Check {capacity_tokens:,.0f} tokens"
"""


def rule_file(tmp_path: Path, body: str, name: str = "rules.yaml") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def with_leaf(leaf: str, extra: str = "") -> str:
    """A one-rule file (id ``bad-rule``) whose single condition is ``leaf``."""
    return (
        "version: 1\nrules:\n  - id: bad-rule\n    mode: full\n    summary: s\n"
        f"    triage: [t]\n{extra}    when:\n      all:\n        - {leaf}\n"
    )


def load_problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_ruleset([path])
    return [str(p) for p in exc.value.problems]


def test_bundled_rules_load_and_cover_every_failure_mode() -> None:
    rs = load_ruleset()
    assert rs.sources and all(Path(s).parent == default_rules_dir() for s in rs.sources)
    modes = {r.mode for r in rs.rules}
    assert modes == set(FailureMode) - {FailureMode.HEALTHY, FailureMode.UNKNOWN}
    ids = [r.id for r in rs.rules]
    assert len(ids) == len(set(ids))
    for r in rs.rules:
        assert r.signals() <= SIGNAL_NAMES


def test_good_file_compiles_into_typed_rules(tmp_path: Path) -> None:
    (rule,) = load_rule_file(rule_file(tmp_path, GOOD))
    assert rule.id == "my-full" and rule.mode is FailureMode.FULL and rule.for_ == 300
    assert rule.signals() == {"kv_usage", "waiting", "preemptions", "ttft_p99"}
    leaves = list(rule.leaves())
    assert len(leaves) == 5
    assert {leaf.fact for leaf in leaves if leaf.fact} == {"group_size"}


@pytest.mark.parametrize(
    ("leaf", "key", "fragment"),
    [
        ('{signal: kv_usagee, stat: mean, op: ">=", value: 0.9}', "when.all.0.signal", "unknown signal 'kv_usagee'"),
        ('{signal: kv_usage, stat: avg, op: ">=", value: 0.9}', "when.all.0.stat", "unknown stat 'avg'"),
        ('{signal: kv_usage, stat: mean, op: "=>", value: 0.9}', "when.all.0.op", "'=>'"),
        ('{signal: kv_usage, stat: mean, op: ">=", value: 0.9, colour: red}', "when.all.0.colour", "unknown key"),
        ('{fact: headroom, op: ">=", value: 1}', "when.all.0.fact", "unknown fact 'headroom'"),
        ('{signal: ttft_p99, stat: mean, op: ">", ref: slo}', "when.all.0.ref", "unknown fact 'slo'"),
        ('{signal: kv_usage, stat: frac_above, op: ">=", value: 0.5}', "when.all.0", "needs an 'arg'"),
        ('{signal: kv_usage, stat: mean, op: ">="}', "when.all.0", "needs a 'value'"),
        ('{signal: kv_usage, fact: group_size, op: ">=", value: 1}', "when.all.0", "exactly one of 'signal' or 'fact'"),
        ('{all: []}', "when.all.0", "at least one condition"),
        ('{all: [{signal: waiting, stat: mean, op: ">", value: 1}], any: [{fact: group_size, op: ">", value: 1}]}',
         "when.all.0", "exactly one of 'all', 'any', 'not'"),
        ('{any: [{not: {signal: queue_p9, stat: mean, op: ">", value: 1}}]}', "when.all.0.any.0.not.signal",
         "unknown signal 'queue_p9'"),
    ],
)
def test_condition_errors_name_file_rule_and_key(tmp_path: Path, leaf: str, key: str, fragment: str) -> None:
    f = rule_file(tmp_path, with_leaf(leaf))
    msgs = load_problems(f)
    assert len(msgs) == 1, msgs  # one problem, not one per union branch
    assert msgs[0].startswith(f"{f}: rules[0] (bad-rule): {key}: "), msgs
    assert fragment in msgs[0]


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ("    for: 5 minutes\n", "for", "expected a duration like 30s"),
        ("    mode: healthy\n", "mode", "decided by kvwatch itself"),
        ("    severity: loud\n", "severity", "'loud'"),
        ("    id: Bad Id\n", "id", "'Bad Id'"),
        ("    sumary: typo\n", "sumary", "unknown key"),
    ],
)
def test_rule_key_errors(tmp_path: Path, extra: str, key: str, fragment: str) -> None:
    # a repeated key in a YAML mapping takes the last value: overrides go after `mode: full`
    text = with_leaf('{signal: kv_usage, stat: mean, op: ">=", value: 0.9}').replace(
        "    mode: full\n", "    mode: full\n" + extra, 1
    )
    f = rule_file(tmp_path, text)
    msgs = load_problems(f)
    hits = [m for m in msgs if f": {key}: " in m]
    assert hits, msgs
    assert hits[0].startswith(f"{f}: rules[0] (") and fragment in hits[0]


@pytest.mark.parametrize(
    ("field", "template", "fragment"),
    [
        ("summary", "KV {kv_usag.mean:.0%}", "unknown name 'kv_usag'"),
        ("summary", "KV {kv_usage.mean:.0%", "bad template"),
        ("triage", "[ok, 'step {nope}']", "unknown name 'nope'"),
    ],
)
def test_template_errors_name_the_template(tmp_path: Path, field: str, template: str, fragment: str) -> None:
    text = with_leaf('{signal: kv_usage, stat: mean, op: ">=", value: 0.9}')
    if field == "summary":
        text = text.replace("summary: s", f'summary: "{template}"')
        where = "summary"
    else:
        text = text.replace("triage: [t]", f"triage: {template}")
        where = "triage[1]"
    f = rule_file(tmp_path, text)
    (msg,) = load_problems(f)
    assert msg.startswith(f"{f}: rules[0] (bad-rule): {where}: ") and fragment in msg


def test_every_problem_of_every_file_is_reported(tmp_path: Path) -> None:
    a = rule_file(tmp_path, with_leaf('{signal: nope, stat: mean, op: ">=", value: 1}'), "a.yaml")
    b = rule_file(tmp_path, with_leaf('{signal: kv_usage, stat: bad, op: ">=", value: 1}').replace("bad-rule", "b-rule"),
                  "b.yaml")
    msgs = load_problems(tmp_path)
    assert any(m.startswith(f"{a}: rules[0] (bad-rule)") for m in msgs)
    assert any(m.startswith(f"{b}: rules[0] (b-rule)") for m in msgs)


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    a = rule_file(tmp_path, GOOD, "a.yaml")
    b = rule_file(tmp_path, GOOD, "b.yaml")
    with pytest.raises(ConfigError) as exc:
        load_ruleset([a, b])
    (p,) = exc.value.problems
    assert p.source == str(b) and "my-full" in p.location and str(a) in p.message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("version: 2\nrules: []\n", "version"),
        ("rules: []\n", "version: required key is missing"),
        ("version: 1\nrules:\n  - id: x\n    mode: full\n", "rules[0] (x): summary: required key is missing"),
        ("version: 1\nrules: [\n", "line "),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_file_level_errors(tmp_path: Path, body: str, fragment: str) -> None:
    f = rule_file(tmp_path, body)
    msgs = load_problems(f)
    assert any(m.startswith(str(f)) and fragment in m for m in msgs), msgs


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_ruleset([tmp_path / "nope.yaml"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no"):
        load_ruleset([tmp_path / "empty"])
