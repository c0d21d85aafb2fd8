"""Issue 13 item 3: rule templates read documented statistics and facts only.

``"{capacity_tokens.__init__.__globals__}"`` used to pass ``kvwatch check`` and dump module
globals into the triage text. ``check`` now refuses it naming file, rule and key, and the
renderer never walks a dunder or item path even if a template got past loading.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.core.rules import check_template
from kvwatch.core.templates import Num, render

RULE = """version: 1
rules:
  - id: evil
    mode: full
    summary: "KV at {{kv_usage.mean:.0%}}"
    when: {{all: [{{signal: kv_usage, stat: mean, op: ">=", value: 0.9}}]}}
    triage:
      - "fine {{capacity_tokens:,.0f}} and {{window.kv_usage.p90:.0%}}"
      - "{bad}"
"""

BAD = [
    "{capacity_tokens.__init__.__globals__}",
    "{kv_usage.mean.__class__}",
    "{window.kv_usage.__dict__}",
    "{capacity_tokens[0]}",
    "{kv_usage['mean']}",
    "{capacity_tokens!r}",
    "{capacity_tokens:{ttft_slo}}",
    "{capacity_tokens:999999999}",
    "{}",
    "{0}",
    "{kv_usage.frac_above}",
    "{window.kv_usage.mean.real}",
    "{not_a_fact}",
]


@pytest.mark.parametrize("bad", BAD)
def test_check_rejects_templates_beyond_facts_and_stats(tmp_path: Path, bad: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.format(bad=bad.replace("'", "''")))
    assert main(["check", "--rules", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(path) in err[0] and "rules[0] (evil)" in err[0] and "triage[1]" in err[0], err[0]
    assert "globals" not in err[0].replace(bad, "") and "<module" not in err[0]


def test_allowed_templates_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.format(bad="ok {for_minutes:.0f}m, {window_minutes:>6.1f}, {ttft_p99.p99:.2f}s"))
    assert main(["check", "--rules", str(path)]) == 0, capsys.readouterr().err
    for good in ("{kv_usage.mean:.0%}", "{window.waiting.max:,.0f}", "{headroom_tokens:,.0f}", "{kv_usage.p10:+.1%}"):
        assert check_template(good) is None, good


def test_renderer_never_walks_into_internals() -> None:
    """Defence in depth: even unchecked, a dunder or item path renders n/a, never an object dump."""
    ctx = {"capacity_tokens": Num(1000.0)}
    for bad in ("{capacity_tokens.__init__.__globals__}", "{capacity_tokens.__class__.__mro__}",
                "{capacity_tokens[0]}"):
        out = render(bad, ctx)
        assert "globals" not in out and "class" not in out and "<" not in out, out
