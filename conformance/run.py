"""``conformance/regenerate``: venvs on demand, drivers over simulator timelines, fixtures.

For each engine version (``--engines``, default all) and variant: simulate the healthy and
full scenarios (fixed seed and end instant, so reruns are comparable), replay each timeline
through the engine's own exporter inside its venv, and write
``tests/fixtures/conformance/<engine>-<version>[-<variant>]-{healthy,full}.om.gz`` plus a
``...-snapshot.prom`` (the last scrape of the full run). Venvs live in
``$KVWATCH_CONFORMANCE_CACHE`` (default ``/work/.cache/conformance`` or
``~/.cache/kvwatch-conformance``), one per version, built once.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance import om
from conformance.engines import BY_KEY, ENGINES, SCENARIOS, EngineVersion, Variant
from conformance.fixtures import FIXTURES, dialect_fingerprint, header_lines
from conformance.timeline import check_finite, simulate_timeline

HERE = Path(__file__).resolve().parent
END_TIME = 1_764_460_800.0  # 2025-11-30T00:00:00Z: fixed, so fixtures are reproducible
DURATION_S = 2400.0
INTERVAL_S = 15.0
SEED = 0
GZIP_ABOVE = 300_000  # bytes


def cache_dir() -> Path:
    env = os.environ.get("KVWATCH_CONFORMANCE_CACHE")
    if env:
        return Path(env)
    work = Path("/work/.cache")
    return work / "conformance" if work.is_dir() else Path.home() / ".cache" / "kvwatch-conformance"


def venv_python(ev: EngineVersion, *, build: bool = True) -> Path:
    """The venv's python; builds it (``pip install --no-cache-dir``) when missing."""
    root = cache_dir() / ev.key
    py = root / "bin" / "python"
    marker = root / ".kvwatch-complete"
    if marker.exists():
        return py
    if not build:
        raise FileNotFoundError(f"no venv for {ev.key} in {root}")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", "-q", *ev.pip],
                   check=True)
    marker.write_text(f"built in {time.monotonic() - started:.0f}s\n")
    return py


def run_driver(ev: EngineVersion, jobs: list[tuple[Path, Path]]) -> float:
    """Replay each (timeline, scrapes) pair through the engine's exporter in one process
    (the engine imports once); returns the seconds it took."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)  # the engine venv must not see kvwatch
    cmd = [str(venv_python(ev)), str(HERE / "drivers" / ev.driver)]
    cmd += [str(p) for pair in jobs for p in pair]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{ev.key}: driver failed ({proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return time.monotonic() - started


def _name(ev: EngineVersion, variant: Variant, kind: str) -> str:
    return "-".join(p for p in (ev.key, variant.name, kind) if p)


def _header(ev: EngineVersion, variant: Variant, scenario: str, preset: str
            ) -> dict[str, str]:
    cmd = f"conformance/regenerate --engines {ev.key}"
    return {
        "kvwatch_conformance_fixture": "v1",
        "engine": ev.engine,
        "version": ev.version,
        "variant": variant.name or "default",
        "scenario": scenario,
        "sim_preset": preset,
        "sim_dialect": ev.sim_dialect,
        "seed": str(SEED),
        "end_time": str(int(END_TIME)),
        "duration_s": str(int(DURATION_S)),
        "interval_s": str(int(INTERVAL_S)),
        "data_parallel": str(variant.data_parallel),
        "options": json.dumps(variant.options, sort_keys=True),
        "instance": _name(ev, variant, scenario),
        "dialects": ",".join(ev.dialects),
        "dialect_fingerprint": dialect_fingerprint(ev.dialects),
        "command": cmd,
        "made_by": f"{ev.driver} in a venv with {' '.join(ev.pip)}",
    }


def _write(path: Path, text: str) -> Path:
    data = text.encode("utf-8")
    if len(data) > GZIP_ABOVE:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)
    return path


def regenerate(ev: EngineVersion, variants: list[Variant], out_dir: Path) -> list[Path]:
    """Both scenarios of each variant of one engine version; returns the files written."""
    with tempfile.TemporaryDirectory(prefix="kvwatch-conf-") as tmp:
        work = Path(tmp)
        plan = []
        for variant in variants:
            for scenario, preset in SCENARIOS.items():
                _, doc = simulate_timeline(preset, ev.sim_dialect, SEED, duration_s=DURATION_S,
                                           end_time=END_TIME, interval_s=INTERVAL_S,
                                           data_parallel=variant.data_parallel)
                check_finite(doc)
                stem = _name(ev, variant, scenario)
                tl, out = work / f"{stem}.json", work / f"{stem}.jsonl"
                tl.write_text(json.dumps({**doc, "options": variant.options}))
                plan.append((variant, scenario, preset, tl, out))
        took = run_driver(ev, [(tl, out) for *_, tl, out in plan])
        print(f"{ev.key}: driver {took:.0f}s for {len(plan)} timelines", flush=True)
        return [path for variant, scenario, preset, _, out in plan
                for path in _fixture(ev, variant, scenario, preset, om.read_scrapes(out),
                                     out_dir)]


def _fixture(ev: EngineVersion, variant: Variant, scenario: str, preset: str,
             scrapes: list[om.Scrape], out_dir: Path) -> list[Path]:
    head = _header(ev, variant, scenario, preset)
    target = (("instance", head["instance"]), ("job", "conformance"))
    base = out_dir / f"{head['instance']}.om"
    for old in (base, base.with_name(base.name + ".gz")):
        old.unlink(missing_ok=True)
    tmp_om = out_dir / f".{base.name}.tmp"
    om.write({target: scrapes}, tmp_om, header_lines(head))
    written = [_write(base, tmp_om.read_text(encoding="utf-8"))]
    tmp_om.unlink()
    print(f"  {written[-1].name}: {len(scrapes)} scrapes, {written[-1].stat().st_size} bytes")
    if scenario == "full":
        snap = out_dir / f"{_name(ev, variant, 'snapshot')}.prom"
        lines = "".join(f"# {x}\n" for x in header_lines({**head, "scenario": "full-last-scrape"}))
        snap.write_text(lines + scrapes[-1].text, encoding="utf-8")
        written.append(snap)
        print(f"  {snap.name}: {snap.stat().st_size} bytes")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance/regenerate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=[e.key for e in ENGINES],
                        choices=sorted(BY_KEY), metavar="ENGINE-VERSION")
    parser.add_argument("--variants", nargs="+", help="only these variant names ('' = default)")
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for key in args.engines:
        ev = BY_KEY[key]
        variants = [v for v in ev.variants
                    if args.variants is None or v.name in args.variants]
        try:
            regenerate(ev, variants, args.out)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print("command:", shlex.join(["conformance/regenerate", *(argv or sys.argv[1:])]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
