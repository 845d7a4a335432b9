"""Every repository path the docs name exists: README.md, docs/**/*.md, and the docstrings and
comments of the project's code (tables/, assignor/, pipeline/, app/, examples/, benchmarks/).

What counts as a path (rules, so a reader knows what is checked and what is not):
- a token of `/`-separated names ending in a file name with an extension (`tables/runtime/task.py`,
  `docs/x.md`, `docker/compose.yaml`), or in `/` (a directory: `tables/testing/`), with an optional
  `:line` suffix (`codecs.py:144`, `:7-16`, `:144,218`): each line named must be in the file;
- rooted at the repository when its first name is a top-level entry of it (`tables/...`,
  `docs/...`, `.ci/run` is not matched: no extension); otherwise, when its first name is a
  subpackage of tables/, assignor/ or pipeline/ (`runtime/handler.py`, `core/plan.py`), it must
  exist under one of them; when its first name is a folder beside the file that names it
  (`bench/worker.md` in docs/benchmarks.md), or it starts with `../`, it is resolved from there;
- a `*` is a glob that must match at least one file (`tests/test_tables_*.py`);
- a path right after the word "then" is a historical name ("then `app/worker.py`, now ..."):
  records of past runs and findings say what the code was called at the time;
- not checked: bare file names (`join.py`: the reader's own files look the same, `paid.py`), URLs,
  paths of other projects (`faust/stores/rocksdb.py`: the first name is not ours), and tokens with
  a placeholder (`{app}`, `<name>`, `NAME`, `...`), and what runs write (GENERATED, git-ignored).

A wrong path is reported with where it was named; `test_a_planted_wrong_path_is_caught` shows
the check fails on one.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("tables", "assignor", "pipeline", "app", "examples", "benchmarks")
PACKAGES = ("tables", "assignor", "pipeline")
# Written by runs, not in a checkout (.gitignore): a doc may say where a run puts its output.
GENERATED = ("benchmarks/out/", ".venv/", "build/", "dist/", "data/", "var/", ".tandem/")

PATH = re.compile(
    r"(?<![\w/.:~$-])"  # not the middle of a longer token, a URL or an absolute path
    r"((?:\.\./)*(?:[\w.*-]+/)+(?:[\w*-]+(?:\.[\w*-]+)*\.(?:py|pyx|md|toml|json|yaml|yml|sh|txt|png|cfg|ini|csv|parquet)|))"
    r"(?::(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*))?"
    r"(?![\w/-])"
)
HISTORICAL = re.compile(r"\bthen `?$", re.IGNORECASE)  # "then `app/worker.py`": what it was called
PLACEHOLDER = re.compile(r"[{}<>]|\.\.\.|(?:^|/)[A-Z][A-Z_]+(?:/|\.|$)")


def top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}


def subpackages() -> set[str]:
    return {p.name for package in PACKAGES for p in (ROOT / package).iterdir() if p.is_dir()}


def doc_texts() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every Markdown line of the README and docs/."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield str(path.relative_to(ROOT)), number, line


def code_texts() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every docstring and comment of the project's code."""
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name.startswith(GENERATED):  # a peer's environment (benchmarks/out/quix-venv) is not ours
                continue
            source = path.read_text()
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    yield name, token.start[0], token.string
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    docstring = ast.get_docstring(node, clean=False)
                    if docstring and node.body:
                        first = node.body[0].lineno
                        for offset, line in enumerate(docstring.splitlines()):
                            yield name, first + offset, line


def named_paths(text: str) -> Iterator[tuple[str, str | None]]:
    """(path, its `:line` suffix or None) of each repository-path-like token of `text`."""
    text = re.sub(r"\w+://\S+", " ", text)  # URLs
    for match in PATH.finditer(text):
        path, lines = match.group(1), match.group(2)
        if PLACEHOLDER.search(path) or HISTORICAL.search(text[: match.start()]):
            continue
        yield path, lines


def candidates(path: str, named_in: str, tops: set[str], subs: set[str]) -> list[Path] | None:
    """Where `path` may be, or None when it is not one of ours (other projects, bare names)."""
    if path.startswith("../"):
        return [(ROOT / named_in).parent / path]
    first = path.split("/", 1)[0]
    if first in tops:
        return [ROOT / path]
    here = (ROOT / named_in).parent
    if here != ROOT and (here / first).is_dir():  # docs/benchmarks.md naming `bench/worker.md`
        return [here / path]
    if first in subs:
        return [ROOT / package / path for package in PACKAGES]
    return None


def problem(path: str, lines: str | None, named_in: str, tops: set[str], subs: set[str]) -> str | None:
    """Why `path` (named in `named_in`) is wrong, or None when it exists (or is not checked)."""
    if path.startswith(GENERATED):
        return None
    places = candidates(path, named_in, tops, subs)
    if places is None:
        return None
    if "*" in path:
        found = [hit for place in places for hit in place.parent.glob(place.name)]
        return None if found else f"{path} matches no file"
    existing = [place for place in places if place.exists()]
    if not existing:
        return f"{path} does not exist"
    if lines and existing[0].is_file():
        length = len(existing[0].read_text(errors="replace").splitlines())
        last = max(int(n) for n in re.findall(r"\d+", lines))
        if last > length:
            return f"{path}:{lines} names line {last}, the file has {length}"
    return None


def wrong_paths(texts: Iterator[tuple[str, int, str]]) -> list[str]:
    tops, subs = top_level(), subpackages()
    found = []
    for named_in, number, text in texts:
        for path, lines in named_paths(text):
            why = problem(path, lines, named_in, tops, subs)
            if why is not None:
                found.append(f"{named_in}:{number}: {why}")
    return found


def test_every_path_the_readme_and_docs_name_exists() -> None:
    found = wrong_paths(doc_texts())
    assert not found, "\n".join(found)


def test_every_path_the_code_s_docstrings_and_comments_name_exists() -> None:
    found = wrong_paths(code_texts())
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("[the run](bench/wroker.md)", "bench/wroker.md does not exist"),
        ("the handler (tables/runtime/handlers.py)", "tables/runtime/handlers.py does not exist"),
        ("see `docs/tabels.md`", "docs/tabels.md does not exist"),
        ("`runtime/audit.py` writes it", "runtime/audit.py does not exist"),
        ("assignor/faust_adapter/__init__.py:999", "names line 999"),
        ("tests/test_nothing_*.py", "matches no file"),
        ("the kit in tables/testing/secure.py", "tables/testing/secure.py does not exist"),
    ],
)
def test_a_planted_wrong_path_is_caught(text: str, wrong: str) -> None:
    found = wrong_paths(iter([("docs/planted.md", 1, text)]))
    assert len(found) == 1 and wrong in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "tables/runtime/task.py and `docs/tables.md`",
        "records/codecs.py:144,218 and assignor/faust_adapter/__init__.py:7-16",
        "faust/stores/rocksdb.py, join.py, https://example.org/docs/x.md, /etc/tandem/x.properties",
        "{app id}-{join}/x.py and benchmarks/out/run.json",
        "then `app/worker.py`, now `tables/runtime/worker.py`",
        "[screenshot](group-page.png), [the kit](../tables/testing/driver.py), bench/worker.md",
    ],
)
def test_a_right_or_unchecked_path_passes(text: str) -> None:
    assert wrong_paths(iter([("docs/planted.md", 1, text)])) == []
