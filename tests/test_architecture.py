"""The package layout holds: imports flow one way, and docs/architecture.md matches the tree.

Every ``import`` in every module (function-level and ``TYPE_CHECKING`` ones included)
is parsed with :mod:`ast`; a module may import only the layers its own layer may
use (``core ← alerting ← service``; ``tools``, ``sim``, ``demo`` → ``core``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "kvwatch"

#: layer of a module: the longest matching prefix wins
LAYERS: dict[str, str] = {
    "kvwatch": "base",
    "kvwatch.errors": "base",
    "kvwatch.durations": "base",
    "kvwatch.redact": "base",
    "kvwatch.textsafe": "base",
    "kvwatch.config": "config",
    "kvwatch.core": "core",
    "kvwatch.alerting": "alerting",
    "kvwatch.service": "service",
    "kvwatch.tools": "tools",
    "kvwatch.sim": "sim",
    "kvwatch.demo": "demo",
    "kvwatch.cli": "cli",
}

#: layer → layers it may import. ``cli`` is the composition root: it loads the
#: sub-command modules by name, and they borrow its shared flag helpers.
ALLOWED: dict[str, set[str]] = {
    "base": {"base"},
    "config": {"base", "config", "core"},
    "core": {"base", "config", "core"},
    "alerting": {"base", "config", "core", "alerting"},
    "service": {"base", "config", "core", "alerting", "service", "cli"},
    "tools": {"base", "config", "core", "alerting", "tools", "cli"},
    "sim": {"base", "config", "core", "sim"},
    "demo": {"base", "config", "core", "sim", "demo", "cli"},
    "cli": set(LAYERS.values()),
}


#: single (module, import) pairs allowed against the layers, each with its reason
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("kvwatch.redact", "kvwatch.config"): "type annotation only (TYPE_CHECKING): install(settings) reads secrets",
}


def layer_of(module: str) -> str:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported kvwatch module) for every import statement in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = package_modules()
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if sub in known else base))
    return [(line, m) for line, m in out if m == "kvwatch" or m.startswith("kvwatch.")]


def test_the_checker_sees_imports_of_every_kind() -> None:
    """Guard against a checker that silently finds nothing: it reads module-level,
    function-level and ``from kvwatch import name`` imports of real modules."""
    found = {m for _, m in imports_of(PKG / "core" / "diagnose" / "__init__.py", "kvwatch.core.diagnose")}
    assert "kvwatch.core.diagnose.target" in found and "kvwatch.core.diagnose.view" in found
    view = {m for _, m in imports_of(PKG / "core" / "diagnose" / "view.py", "kvwatch.core.diagnose.view")}
    assert "kvwatch.core.statistics.fleet" in view
    cli = {m for _, m in imports_of(PKG / "cli.py", "kvwatch.cli")}
    assert "kvwatch.service.once" in cli  # imported inside a function
    assert "kvwatch" in cli  # from kvwatch import __version__
    assert layer_of("kvwatch.core.statistics.registry") == "core"
    assert layer_of("kvwatch.cli") == "cli" and layer_of("kvwatch") == "base"


def test_imports_flow_one_way() -> None:
    bad: list[str] = []
    for module, path in package_modules().items():
        mine = layer_of(module)
        for line, target in imports_of(path, module):
            theirs = layer_of(target)
            if theirs not in ALLOWED[mine] and (module, target) not in EXCEPTIONS:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target} ({theirs})")
    assert not bad, "imports against the layering of docs/architecture.md:\n" + "\n".join(bad)


def _doc_modules() -> set[str]:
    """Module paths named in the first column of the ownership table of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return set(re.findall(r"^\|\s*`(kvwatch/[\w/]+\.py)`", text, re.MULTILINE))


def test_architecture_doc_lists_exactly_the_modules_of_the_tree() -> None:
    listed = _doc_modules()
    tree = {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")}
    assert listed, "no module table found in docs/architecture.md"
    assert not listed - tree, f"listed but missing: {sorted(listed - tree)}"
    assert not tree - listed, f"in the tree but not listed: {sorted(tree - listed)}"


@pytest.mark.parametrize("layer", sorted(set(LAYERS.values())))
def test_every_layer_has_modules(layer: str) -> None:
    assert any(layer_of(m) == layer for m in package_modules()), layer
