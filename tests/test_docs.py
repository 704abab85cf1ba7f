"""The docs as a reader follows them (README.md and docs/*.md): every relative
link reaches a file, and a heading for a `#anchor`; every `hydra.launcher.*` key
they name is a field of a launcher's config dataclass; the README stays a short
front door whose first commands are the two set-up scripts. Plain text checks,
no Ray."""

import collections
import dataclasses
import re
import types
import typing
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hydra_plugins.hydra_ray_launcher._config import (
    RayAWSLauncherConf,
    RayClusterLauncherConf,
    RayJobsLauncherConf,
    RayLauncherConf,
)

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS_DIR = REPO / "docs"
PAGES = [README, *sorted(DOCS_DIR.glob("*.md"))]
LAUNCHER_CONFS: tuple[type[Any], ...] = (
    RayLauncherConf,
    RayAWSLauncherConf,
    RayClusterLauncherConf,
    RayJobsLauncherConf,
)
README_MAX_LINES = 300

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})(.*)$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target), with an optional "title" after the target.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
_KEY = re.compile(r"(\+?)hydra\.launcher\.([A-Za-z0-9_.]*)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def _lines(page: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block) for each line; the fence
    lines themselves count as inside."""
    fence = ""
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        match = _FENCE.match(line)
        if not fence and match:
            fence = match.group(1)
            yield number, line, True
            continue
        closes = (
            match is not None
            and match.group(1)[0] == fence[:1]
            and len(match.group(1)) >= len(fence)
            and not match.group(2).strip()
        )
        yield number, line, bool(fence)
        if closes:
            fence = ""


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, lower-case, every
    character but letters, digits, spaces, `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a Markdown file's headings; a repeated heading gets
    `-1`, `-2`, ... as on GitHub."""
    seen: collections.Counter[str] = collections.Counter()
    found: set[str] = set()
    for _, line, in_code in _lines(page):
        match = None if in_code else _HEADING.match(line)
        if match:
            slug = github_slug(match.group(1))
            found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
            seen[slug] += 1
    return found


def link_problems(page: Path) -> list[str]:
    problems = []
    for number, line, in_code in _lines(page):
        if in_code:
            continue
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            where = f"{_page_id(page)}:{number}: link ({target})"
            if _SCHEME.match(target):
                continue  # http(s), mailto: not checked
            path_part, _, anchor = target.partition("#")
            path_part = urllib.parse.unquote(path_part)
            if not path_part:
                dest = page
            elif path_part.startswith("/"):
                dest = REPO / path_part.lstrip("/")
            else:
                dest = (page.parent / path_part).resolve()
            if dest != REPO and REPO not in dest.parents:
                problems.append(f"{where}: points outside the repository, to {dest}")
            elif not dest.exists():
                problems.append(f"{where}: no such file {dest.relative_to(REPO)}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(
                    f"{where}: no heading in {dest.relative_to(REPO)} has the anchor #{anchor}"
                )
    return problems


def _field_types(conf: type[Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(conf)
    return {f.name: hints[f.name] for f in dataclasses.fields(conf)}


def _takes_any_key(tp: Any) -> bool:
    """A field typed Any or a dict (or a union with one): any key below it is
    the user's (Ray's ray.init arguments, a provider's keys, env vars...)."""
    if tp is Any or tp is dict:
        return True
    origin = typing.get_origin(tp)
    if origin is dict:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_takes_any_key(arg) for arg in typing.get_args(tp))
    return False


def key_is_declared(conf: type[Any], parts: list[str], added: bool) -> bool:
    """Whether hydra.launcher.<parts> names a key of the launcher config `conf`.
    `added` (the key was written with a leading `+`) also accepts one new key
    directly below a declared node, Hydra's form for an argument the dataclass
    does not list (`+hydra.launcher.ray.init._temp_dir=...`)."""
    node = conf
    for i, part in enumerate(parts):
        fields = _field_types(node)
        last = i == len(parts) - 1
        if part not in fields:
            return added and last
        tp = fields[part]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            node = tp
            continue
        return last or _takes_any_key(tp)
    return True


def key_problems(page: Path) -> list[str]:
    problems = []
    for number, line, _ in _lines(page):
        for plus, dotted in _KEY.findall(line):
            key = dotted.rstrip(".")
            if not key:
                continue  # hydra.launcher itself (`hydra.launcher.*`)
            parts = key.split(".")
            if not any(key_is_declared(conf, parts, bool(plus)) for conf in LAUNCHER_CONFS):
                problems.append(
                    f"{_page_id(page)}:{number}: {plus}hydra.launcher.{key} is no field of "
                    f"{', '.join(c.__name__ for c in LAUNCHER_CONFS)}"
                )
    return problems


def test_there_are_docs_pages_besides_the_readme() -> None:
    assert len(PAGES) > 1, f"no Markdown pages in {DOCS_DIR}"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_reaches_a_file_and_its_heading(page: Path) -> None:
    problems = link_problems(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_hydra_launcher_key_named_is_a_config_field(page: Path) -> None:
    problems = key_problems(page)
    assert not problems, "unknown keys:\n" + "\n".join(problems)


def test_the_readme_stays_under_300_lines() -> None:
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count < README_MAX_LINES, (
        f"README.md:{count}: {count} lines; the README stays under {README_MAX_LINES}: "
        "move detail to a page in docs/"
    )


def test_the_readme_first_code_block_is_the_two_set_up_commands() -> None:
    block: list[str] = []
    start = 0
    for number, line, in_code in _lines(README):
        if in_code:
            start = start or number
            block.append(line)
        elif block:
            break
    text = "\n".join(block)
    for command in ("bash scripts/example.sh", "bash scripts/test.sh"):
        assert command in text, (
            f"README.md:{start}: the first fenced code block does not contain {command!r}:\n{text}"
        )


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, line, in_code in _lines(README)
        if not in_code
        for target in _LINK.findall(_CODE_SPAN.sub("", line))
    }
    missing = [_page_id(p) for p in PAGES[1:] if p not in linked]
    assert not missing, f"README.md: no link to {', '.join(missing)}"


@pytest.mark.parametrize("page", PAGES[1:], ids=_page_id)
def test_every_docs_page_links_back_to_the_readme(page: Path) -> None:
    for number, line, in_code in _lines(page):
        if not in_code and "](../README.md)" in line:
            assert number <= 5, f"{_page_id(page)}:{number}: the link to the README comes late"
            return
    pytest.fail(f"{_page_id(page)}:1: no link back to ../README.md")
