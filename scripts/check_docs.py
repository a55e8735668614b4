#!/usr/bin/env python3
"""Checks that the documentation agrees with the repository, and regenerates its generated tables.

    python3 scripts/check_docs.py            # check; exits 1 and says what is wrong
    python3 scripts/check_docs.py --write    # regenerates the generated tables, then checks

`bash scripts/dev.sh test` runs it. What it checks:

1. Notes. A Note is defined by a line that holds only its title, ``Note [Name]`` (after a comment
   marker, ``//`` or ``#``, or none inside a Python docstring), and then a line of ``~`` under it.
   Every ``Note [Name]`` cited in a file of the repository (C++, Python, CMake, shell, Markdown;
   a citation may wrap over lines and comment markers) has exactly one definition, unless it is
   one of the few Notes of PyTorch the code cites (EXTERNAL_NOTES).
2. Paths. Every repository path README.md and docs/ cite exists: a Markdown link's target
   (relative to the file), and a word that starts with a top-level folder or file of the
   repository (``core/``, ``docs/results.md``, ``scripts/dev.sh``). Build outputs (``build/...``) are not in the
   repository and are not checked.
3. Generated tables. A block of a Markdown file between ``<!-- generated: NAME -->`` and
   ``<!-- end generated -->`` is what GENERATORS[NAME] makes from the tree (the installed headers,
   the Python package's modules); a stale block fails the check and --write rewrites it.
"""

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

# The checker and its test quote titles and paths as examples of what they check.
EXCLUDED = {"scripts/check_docs.py", "tests/docs/test_check_docs.py"}

CITATION = re.compile(r"Note\s+\[([^\]]+)\]")
TITLE = re.compile(r"Note \[([^\]]+)\]")
COMMENT_MARKER = re.compile(r"^\s*(?://+|#+)?\s*")
UNDERLINE = re.compile(r"~{3,}")
# How many following lines a citation may wrap over.
WRAP = 3
# Notes of other projects that comments cite where they explain what this code relies on.
EXTERNAL_NOTES = {
    "Acquire lock when using random generators",  # PyTorch, ATen/core/Generator.h
}

# Markdown: a link's target, and a word in backticks or plain text that may be a path.
LINK = re.compile(r"\]\(([^)\s]+)\)")
WORD = re.compile(r"[A-Za-z0-9_.\-/*]+")
# A C++ file named without a folder, or as `#include <torchdefer/...>` names it.
CPP_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
CPP_NAME = re.compile(r"(?<![\w./-])((?:torchdefer/)?[\w-]+\.(?:h|cpp|cu|cuh))(?![\w/])")
GENERATED = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)

# The layers, lowest first (Note [Layers as targets] in CMakeLists.txt): name, folder.
LAYERS = [("core", "core"), ("recorder", "recorder"), ("replay", "replay"), ("entry", "api")]


def repository_files(root: Path) -> List[str]:
    """The files git tracks or would track (untracked, not ignored), relative to `root`."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root, check=True, capture_output=True).stdout.decode()
    return sorted(p for p in set(listing.split("\0")) if p and (root / p).is_file())


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""  # binary data cites nothing


def check_notes(root: Path, files: List[str]) -> List[str]:
    defined: Dict[str, List[str]] = {}
    cited: Dict[str, List[str]] = {}
    problems = []
    for rel in files:
        if rel in EXCLUDED:
            continue
        lines = [COMMENT_MARKER.sub("", line, count=1).rstrip()
                 for line in read_text(root / rel).splitlines()]
        for i, line in enumerate(lines):
            where = f"{rel}:{i + 1}"
            title = TITLE.fullmatch(line)
            if title and i + 1 < len(lines) and UNDERLINE.fullmatch(lines[i + 1]):
                defined.setdefault(title.group(1), []).append(where)
            # Citations that start on this line, read with the lines it may wrap over.
            window = " ".join([line, *lines[i + 1:i + 1 + WRAP]])
            for match in CITATION.finditer(window):
                if match.start() < len(line):
                    cited.setdefault(" ".join(match.group(1).split()), []).append(where)
    for name, places in sorted(defined.items()):
        if len(places) > 1:
            problems.append(f"Note [{name}] is defined {len(places)} times: {', '.join(places)}")
    for name, places in sorted(cited.items()):
        if name not in defined and name not in EXTERNAL_NOTES:
            problems.append(f"Note [{name}] is cited but defined nowhere: {', '.join(places)}")
    return problems


def cited_paths(text: str, top_level: set) -> List[Tuple[str, bool]]:
    """Paths `text` cites, each with whether it is relative to the citing file: link targets that
    are no URLs or anchors, and words whose first component is a top-level entry of the
    repository."""
    found = []
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+:|#", target):
            found.append((target.split("#")[0], True))
    for word in WORD.findall(LINK.sub("]", text)):
        word = word.rstrip(".")
        first = word.split("/")[0]
        if first in top_level and (word != first or "." in first):
            found.append((word, False))
    return found


def check_paths(root: Path, files: List[str]) -> List[str]:
    top_level = {p.split("/")[0] for p in files}
    # C++ files cited by name (`recording.cpp`) or as included (`torchdefer/fake_tensor.h`); the
    # configured headers (cmake/*.h.in) are included by their names too.
    cpp_names = {p.rsplit("/", 1)[-1] for p in files if p.endswith(CPP_SUFFIXES)}
    cpp_names |= {p.rsplit("/", 1)[-1][:-len(".in")] for p in files if p.endswith(".h.in")}
    problems = []
    for rel in files:
        if rel in EXCLUDED or not (rel == "README.md" or (rel.startswith("docs/")
                                                          and rel.endswith(".md"))):
            continue
        for number, line in enumerate(read_text(root / rel).splitlines(), 1):
            for path, relative in cited_paths(line, top_level):
                base = (root / rel).parent if relative else root
                if not (list(base.glob(path)) if "*" in path else (base / path).exists()):
                    problems.append(f"{rel}:{number}: cites {path}, which does not exist")
            for name in CPP_NAME.findall(line):
                if name.rsplit("/", 1)[-1] not in cpp_names:
                    problems.append(f"{rel}:{number}: cites {name}, which no file of the "
                                    "repository is called")
    return problems


def installed_headers(root: Path) -> str:
    """docs/design.md's table of the layers and the headers each installs (every layer's include/,
    cmake/TorchdeferInstall.cmake), and the generated version.h."""
    rows = ["| layer | folder | CMake target | public headers (installed) |",
            "|---|---|---|---|"]
    count = 0
    for name, folder in LAYERS:
        headers = sorted(p.name for p in (root / folder / "include" / "torchdefer").glob("*.h"))
        count += len(headers)
        listed = ", ".join(f"`{h}`" for h in headers) or "none"
        rows.append(f"| {name} | `{folder}/` | `torchdefer_{folder}` | {listed} |")
    generated = sorted(p.name[:-len(".in")] for p in (root / "cmake").glob("*.h.in"))
    count += len(generated)
    rows.append("| (configured) | `cmake/` | | " + ", ".join(f"`{h}`" for h in generated) + " |")
    return "\n".join(rows) + f"\n\n{count} headers are installed.\n"


def first_sentence(docstring: str) -> str:
    """A docstring's first sentence, as Markdown (reStructuredText's ``code`` is `code` there)."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    sentence = match.group(1) if match else paragraph
    sentence = re.sub(r":\w+:`", "`", sentence.rstrip(".").replace("``", "`"))  # :func:`x`
    return sentence.replace("|", "\\|")


def python_modules(root: Path) -> str:
    """docs/design.md's table of the Python package's modules: each module's first docstring
    sentence, and the Notes it defines."""
    package = root / "bindings" / "torchdefer"
    rows = ["| module | what it holds | Notes |", "|---|---|---|"]
    for path in sorted(package.rglob("*.py")):
        source = read_text(path)
        docstring = ast.get_docstring(ast.parse(source)) or ""
        lines = [COMMENT_MARKER.sub("", line, count=1).rstrip() for line in source.splitlines()]
        defines = [f"`Note [{m.group(1)}]`" for i, line in enumerate(lines[:-1])
                   for m in [TITLE.fullmatch(line)] if m and UNDERLINE.fullmatch(lines[i + 1])]
        rows.append(f"| `{path.relative_to(package).as_posix()}` | {first_sentence(docstring)} | "
                    f"{', '.join(defines)} |")
    return "\n".join(rows) + "\n"


GENERATORS: Dict[str, Callable[[Path], str]] = {
    "installed-headers": installed_headers,
    "python-modules": python_modules,
}


def check_generated(root: Path, files: List[str], write: bool) -> List[str]:
    problems = []
    for rel in files:
        if rel in EXCLUDED or not rel.endswith(".md"):
            continue
        text = read_text(root / rel)

        def regenerate(match: "re.Match[str]") -> str:
            name = match.group(2)
            if name not in GENERATORS:
                problems.append(f"{rel}: no generator for the block `{name}`")
                return match.group(0)
            fresh = GENERATORS[name](root)
            if fresh != match.group(3) and not write:
                problems.append(f"{rel}: the generated block `{name}` is stale: run "
                                "python3 scripts/check_docs.py --write")
            return match.group(1) + fresh + match.group(4)

        updated = GENERATED.sub(regenerate, text)
        if write and updated != text:
            (root / rel).write_text(updated, encoding="utf-8")
            print(f"check_docs: rewrote the generated blocks of {rel}")
    return problems


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the generated tables")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the repository (default: this script's)")
    args = parser.parse_args(argv)
    files = repository_files(args.root)
    problems = (check_generated(args.root, files, args.write) + check_notes(args.root, files)
                + check_paths(args.root, files))
    for problem in problems:
        print(f"check_docs: {problem}", file=sys.stderr)
    if problems:
        print(f"check_docs: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"check_docs: Notes, cited paths and generated tables of {len(files)} files agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
