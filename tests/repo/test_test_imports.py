"""The tests' own layering: no module under tests/ imports a test module (test_*). What more than one test module
uses (fakes, fixtures, helpers) lives in tests/support, the one folder on pytest's `pythonpath` (pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# An import statement on a line of its own, anywhere: at module level, inside a function, or in the text of a script
# a test runs in a subprocess (its source held in a string).
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b|import[ \t]+([\w., \t]+))", re.M)


def imported_modules(source: str) -> set[str]:
    """The top-level names of the modules `source` imports."""
    names = set()
    for from_module, modules in IMPORT.findall(source):
        for module in [from_module] if from_module else modules.split(","):
            top = module.split()[0].split(".")[0] if module.strip() else ""
            if top:  # not a relative import's leading dots
                names.add(top)
    return names


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(TESTS)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in sorted(imported_modules(path.read_text()))
        if name.startswith("test_")
    ]
    assert not offenders, "move what they share into tests/support:\n" + "\n".join(offenders)


def test_the_check_sees_every_kind_of_import() -> None:
    source = (
        "import os, test_a as a\n"
        "from test_b.inner import x\n"
        "def f():\n"
        "    from test_c import y\n"
        'SCRIPT = """\n'
        "import sys\n"
        "from test_d import z\n"
        '"""\n'
    )
    assert imported_modules(source) == {"os", "test_a", "test_b", "test_c", "sys", "test_d"}
    handler = (TESTS / "server" / "test_handler.py").read_text()
    assert {"fake_engine", "in_process_wyoming", "wyoming_qwen3tts"} <= imported_modules(handler)
