"""A cache for generated test data, keyed by the code that generates it (never stale).

``generated(name, params, modules, make)`` returns a directory that ``make(dir)`` filled. The
key hashes ``params``, the Python/numpy/promtool versions and the source of every ``kvwatch``
module a fresh interpreter loads when it imports ``modules`` (the generator and everything it
uses), so any edit to the generator, a version change or new parameters build anew; code the
generator does not import (kvwatch's classifier, its rules) never invalidates it, and the test
still runs that code on the data every time.

Where: ``$KVWATCH_TEST_CACHE`` or ``~/.cache/kvwatch-tests``; ``KVWATCH_TEST_CACHE=off`` builds
in a temporary directory every time. Entries are written to a temporary name and renamed
into place, so parallel runs never see half an entry; entries of the same name unused for
6 hours are removed when a new one is made.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.prom import PROMTOOL

_UNUSED_S = 6 * 3600.0  # an entry of the same name unused this long is removed when a new one is made


def _generator_sources(modules: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, source file) of every kvwatch module loaded by importing ``modules`` afresh."""
    code = (f"import importlib, json, sys\nfor m in {list(modules)!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted((n, getattr(m, '__file__', None) or '') for n, m in sys.modules.items()"
            " if n == 'kvwatch' or n.startswith('kvwatch.'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the files this run imports
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120, env=env).stdout
    return [tuple(x) for x in json.loads(out)]


def _key(params: dict[str, Any], modules: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(params, sort_keys=True, default=repr).encode())
    h.update(sys.version.encode())
    try:
        import numpy

        h.update(numpy.__version__.encode())
    except ImportError:
        pass
    promtool = shutil.which(PROMTOOL)
    if promtool:  # blocks written by promtool depend on its version
        h.update(subprocess.run([promtool, "--version"], capture_output=True, text=True, timeout=60).stdout.encode())
    for name, path in _generator_sources(modules):
        h.update(name.encode())
        if path:
            h.update(Path(path).read_bytes())
    return h.hexdigest()[:20]


def generated(name: str, params: dict[str, Any], modules: tuple[str, ...], make: Callable[[Path], None],
              scratch: Path) -> Path:
    """The directory ``make`` fills for ``params`` (built now, or the cached one); read-only use.

    ``scratch``: where to build when the cache is off (``KVWATCH_TEST_CACHE=off``).
    """
    setting = os.environ.get("KVWATCH_TEST_CACHE", "")
    if setting.lower() == "off":
        out = scratch / name
        make(out)
        return out
    root = Path(setting) if setting else Path.home() / ".cache" / "kvwatch-tests"
    final = root / f"{name}-{_key(params, modules)}"
    if (final / ".complete").exists():
        os.utime(final)  # most recently used: kept by the pruning below
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        make(tmp)
        (tmp / ".complete").write_text(json.dumps(params, sort_keys=True, default=repr) + "\n")
        try:
            tmp.rename(final)
        except OSError:  # a parallel run finished first: use its entry
            if not (final / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for other in [*root.glob(f"{name}-*"), *root.glob(f".{name}-*")]:  # the latter: builds that were killed
        try:  # only entries nobody used for hours: a parallel run on other code may be reading its own
            unused = time.time() - other.stat().st_mtime > _UNUSED_S
        except OSError:
            continue
        if other != final and unused:
            shutil.rmtree(other, ignore_errors=True)
    return final
