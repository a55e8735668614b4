"""scripts/check_docs.py on small repositories made in tmp_path: a tree that agrees passes, and
each kind of disagreement fails with a message naming it."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_docs.py"


def run(root: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *flags],
                          capture_output=True, text=True)


def make_tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def good_files() -> dict:
    return {
        "core/src/a.cpp": "// Note [Alpha]\n// ~~~~~~~~~~~~~~\n// Why.\nint a;  // (Note\n// [Alpha])\n",
        "core/include/torchdefer/a.h": "#pragma once\n",
        "tools/b.py": '"""Tool b.\n\nNote [Beta]\n~~~~~~~~~~~\nWhy b."""\n',
        "docs/guide.md": ("See `Note [Alpha]` in core/src/a.cpp and [b](../tools/b.py); "
                          "build/ is an output.\n"),
        "README.md": "[guide](docs/guide.md), Note [Beta], `a.cpp`.\n",
    }


def test_a_tree_that_agrees_passes(tmp_path):
    result = run(make_tree(tmp_path, good_files()))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("change, message", [
    ({"docs/guide.md": "Note [Gamma] is nowhere.\n"}, "Note [Gamma] is cited but defined nowhere"),
    ({"tools/c.py": "# Note [Alpha]\n# ~~~~~~~~~~~~~~\n"}, "Note [Alpha] is defined 2 times"),
    ({"core/src/d.cpp": "// Note [Delta]\n// Why, with no underline.\n"},
     "Note [Delta] is cited but defined nowhere"),
    ({"README.md": "See core/src/gone.cpp.\n"}, "cites core/src/gone.cpp, which does not exist"),
    ({"docs/guide.md": "[x](missing.md)\n"}, "cites missing.md, which does not exist"),
    ({"docs/guide.md": "In `torchdefer/gone.h`.\n"}, "cites torchdefer/gone.h, which no file"),
])
def test_each_disagreement_fails(tmp_path, change, message):
    result = run(make_tree(tmp_path, {**good_files(), **change}))
    assert result.returncode == 1
    assert message in result.stderr


def test_a_stale_generated_table_fails_and_write_regenerates_it(tmp_path):
    block = "<!-- generated: installed-headers -->\n| old |\n<!-- end generated -->\n"
    root = make_tree(tmp_path, {**good_files(), "docs/design.md": block})
    stale = run(root)
    assert stale.returncode == 1
    assert "the generated block `installed-headers` is stale" in stale.stderr

    assert run(root, "--write").returncode == 0
    assert "| core | `core/` | `torchdefer_core` | `a.h` |" in (root / "docs/design.md").read_text()
    assert run(root).returncode == 0


def test_an_unknown_generated_block_fails(tmp_path):
    block = "<!-- generated: nothing-makes-this -->\n<!-- end generated -->\n"
    result = run(make_tree(tmp_path, {**good_files(), "docs/x.md": block}))
    assert result.returncode == 1
    assert "no generator for the block `nothing-makes-this`" in result.stderr
