"""Issue 13 item 4: label values cannot forge terminal lines, recolour the screen or widen every row."""

from __future__ import annotations

import re

from support.results import AT, target_result

from kvwatch.alerting.sinks.console import event_line
from kvwatch.core.models import (
    Evaluation,
    FailureMode,
    TargetResult,
)
from kvwatch.core.report import TARGET_WIDTH, to_text
from kvwatch.textsafe import printable

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _result(job: str, instance: str, model: str = "m", state: FailureMode = FailureMode.FULL,
            summary: str = "KV pinned.") -> TargetResult:
    return target_result(state, job=job, instance=instance, model=model, stat="mean", threshold=0.9,
                         confidence=0.9, summary=summary, triage=("step one", "step two"), missing=(), facts={})


def test_newlines_and_ansi_in_labels_do_not_forge_lines() -> None:
    evil = "10.0.0.1:8000\n🟢 healthy                  vllm/fake  \x1b[2J\x1b[31mred\r\u202eevil"
    ev = Evaluation(AT, (_result("vllm", evil, summary="pinned\nFAKE: all good\x1b[0m"), _result("vllm", "ok:1")),
                    1800.0)
    text = to_text(ev)
    assert "\x1b" not in text and "\r" not in text and not _CONTROL.search(text)
    lines = text.splitlines()
    # 3 header lines, then per target: head, why, first, 2., blank
    assert sum(1 for ln in lines if ln.startswith(("🔴", "🟢"))) == 2, text
    assert not any(ln.startswith("FAKE") or ln.lstrip().startswith("🟢 healthy") for ln in lines), text
    assert "vllm/10.0.0.1:8000\\n" in text and "pinned\\nFAKE: all good\\x1b[0m" in text


def test_a_300_character_instance_does_not_pad_every_row() -> None:
    ev = Evaluation(AT, (_result("vllm", "i" * 300), _result("vllm", "10.0.0.2:8000")), 1800.0)
    heads = [ln for ln in to_text(ev).splitlines() if ln.startswith("🔴")]
    assert len(heads) == 2
    assert all(len(h) < TARGET_WIDTH + 80 for h in heads), [len(h) for h in heads]
    assert "…" in heads[0]


def test_console_alert_line_is_one_line() -> None:
    from test_hostile_slack import event, incident

    line = event_line(event(incident(instance="a\nkvwatch alert resolve mode=full", summary="x\r\ny")))
    assert "\n" not in line and "\r" not in line


def test_printable_keeps_emoji_and_escapes_controls() -> None:
    assert printable("👩‍💻 ok é") == "👩‍💻 ok é"
    assert printable("a\nb\tc\x00\x1b\u2028") == "a\\nb\\tc\\x00\\x1b\\u2028"
