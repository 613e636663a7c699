"""The docs the suite keeps true: what they say of the code's layout, hooks, links and wire format.

- **Layout.** docs/development.md's "Layout" section holds one fenced block, one entry a line: a path
  from the repository root (a folder ends in `/`), two or more spaces, and one line on what it holds,
  at most 100 characters in all. Every module under web/, worker/, common/ and scripts/ (every .py
  file but `__init__.py` and the generated `*_pb2.py` / `*_pb2_grpc.py`) has its line, and every path
  the block names exists.
- **Hooks.** docs/models.md's "The Task interface" table has a row for every hook of
  `funnel.common.tasks.Task`, and none for anything else. A hook is every public name (no leading
  underscore, so no dunder either) of the class itself: its methods and properties (`vars(Task)`) and
  its class attributes, annotated only or with a default (`Task.__annotations__`). Instance
  attributes `__init__` sets (`spec`, `limits`) are not hooks. A row names its hook first, in
  backticks: `` `preprocess(item)` `` or `` `input_kind` ``. The same page calls `Linger` (a class)
  no protocol and the backends (a closed set) no seam.
- **Links.** Every inline link `[text](target)` (outside code) of README.md, docs/*.md,
  benchmarks/*.md and CHANGELOG.md resolves: a relative path (to a file, or a folder) exists, and an
  anchor, `#anchor` or `file.md#anchor`, is the GitHub slug of a heading of that file (lowercased,
  every character but letters, digits, `_`, `-` and spaces dropped, spaces to `-`; a repeated slug
  gets `-1`, `-2`). A section cited by title, `docs/x.md, "Title"` or `x.md ("Title")`, is a
  heading of that file (its text as rendered, or the part before a colon).
- **Wire format.** docs/architecture.md's "Wire format" section names, in code spans, every field of
  `common/contracts/wire.py`'s `Job` and every key `encode_job` writes for a job with every optional
  field set (one item and several), every key `encode_reply` writes, and lists each job format the
  code knows, `- format N: ...` for N from 1 to `JOB_FORMAT` and no other, the line of
  `CONTEXT_FORMAT` naming it.
- **Peers and GPUs.** README.md's "Read on" row of docs/performance.md and docs/development.md's
  "Tests and benchmarks" name every peer `make bench` measures (service-streamer, LitServe, infinity,
  Ray Serve, plain Flask) and the GPUs measured (H100, H200); README.md stays at most 150 lines.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from functools import cache
from pathlib import Path

import msgpack
import numpy as np
import pytest

from funnel.common.contracts import wire
from funnel.common.tasks.base import Task
from funnel.worker.backend import Backend
from funnel.worker.linger import Linger

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("web", "worker", "common", "scripts")
GENERATED = ("_pb2.py", "_pb2_grpc.py")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\n[ \t]*\n).)+?\1", re.DOTALL)
CITATION = re.compile(r"`?((?:\.\./)?[\w./-]+\.md)`?\)?,?\s+\(?\"([^\"]{1,80})\"")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def documents() -> list[Path]:
    """Every Markdown file whose links the suite keeps resolving."""
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md",
             *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]
    return [path for path in found if path.is_file()]


def name(path: Path, root: Path = ROOT) -> str:
    return path.relative_to(root).as_posix()


@cache
def prose(path: Path) -> str:
    """The file with its fenced code blocks blanked (lines kept, so line numbers stay true)."""
    lines, fence = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = ""
            lines.append("")
        elif opened:
            fence = opened.group(1)
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def rendered(heading: str) -> str:
    """A heading's text as GitHub shows it: links by their text, no code marks, no HTML."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").strip()


def slug(text: str) -> str:
    """GitHub's anchor for a heading's rendered text."""
    kept = "".join(c for c in text.lower()
                   if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return kept.replace(" ", "-")


@cache
def headings(path: Path) -> tuple[str, ...]:
    """The rendered text of every heading of a Markdown file, in order (none inside code blocks)."""
    return tuple(rendered(m.group(2)) for m in map(HEADING.match, prose(path).splitlines()) if m)


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for text in headings(path):
        base = slug(text)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def section(path: Path, title: str) -> str:
    """The text (code blocks included) from the heading `title` to the next heading of its level or above."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blank = prose(path).splitlines()
    start = level = None
    for number, line in enumerate(blank):
        heading = HEADING.match(line)
        if not heading:
            continue
        if start is None and rendered(heading.group(2)) == title:
            start, level = number, len(heading.group(1))
        elif start is not None and len(heading.group(1)) <= level:
            return "\n".join(lines[start:number])
    assert start is not None, f"{name(path)} has no section {title!r}"
    return "\n".join(lines[start:])


# -- layout ------------------------------------------------------------------------------------------


def modules() -> set[str]:
    return {name(path) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
            if path.name != "__init__.py" and not path.name.endswith(GENERATED)
            and "__pycache__" not in path.parts}


def layout() -> list[tuple[str, str, str]]:
    """The Layout block of docs/development.md: (path, what it holds, the whole line) per line."""
    text = section(ROOT / "docs" / "development.md", "Layout")
    block = re.search(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert block, "docs/development.md's Layout section has no fenced block"
    entries = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        entry = re.match(r"(\S+) {2,}(\S.*)$", line)
        assert entry, f"docs/development.md, Layout: {line!r} is not `path  what it holds`"
        entries.append((entry.group(1), entry.group(2), line))
    return entries


def test_the_layout_names_every_module():
    named = {path for path, _, _ in layout()}
    missing = sorted(modules() - named)
    assert not missing, f"docs/development.md's Layout has no line for {missing}"


def test_every_path_in_the_layout_exists_once_with_one_short_line():
    seen: set[str] = set()
    for path, what, line in layout():
        assert path not in seen, f"docs/development.md, Layout: {path} has two lines"
        seen.add(path)
        target = ROOT / path
        assert target.is_dir() if path.endswith("/") else target.is_file(), \
            f"docs/development.md, Layout: {path} does not exist"
        assert len(line) <= 100, f"docs/development.md, Layout: {path}'s line is {len(line)} characters, over 100"
        assert len(what) >= 8, f"docs/development.md, Layout: {path} says too little of what it holds: {what!r}"


def test_the_layout_check_sees_the_modules_it_must():
    # The walk itself: a renamed folder would otherwise make both tests above pass on nothing.
    found = modules()
    assert {"web/pipeline.py", "worker/main.py", "common/contracts/wire.py", "scripts/cli.py"} <= found
    assert not any(path.endswith(("__init__.py", *GENERATED)) for path in found)


# -- hooks -------------------------------------------------------------------------------------------


def hooks() -> set[str]:
    """Every public name Task itself defines: methods, properties and class attributes."""
    return {n for n in {*vars(Task), *Task.__annotations__} if not n.startswith("_")}


def hook_rows() -> list[str]:
    """The hook each row of the first table of docs/models.md's "The Task interface" names."""
    text = section(ROOT / "docs" / "models.md", "The Task interface")
    table = re.search(r"^\|.*?(?=^[^|])", text + "\n\n", re.DOTALL | re.MULTILINE)
    assert table, "docs/models.md's The Task interface has no table"
    rows = table.group(0).splitlines()[2:]
    names = []
    for row in rows:
        hook = re.match(r"\| `(\w+)", row)
        assert hook, f"docs/models.md's hooks table: a row that names no hook first, in backticks: {row}"
        names.append(hook.group(1))
    return names


def test_the_hooks_table_has_a_row_for_every_hook_and_no_other():
    rows = hook_rows()
    repeated = sorted({r for r in rows if rows.count(r) > 1})
    assert not repeated, f"docs/models.md's hooks table repeats {repeated}"
    missing, stale = sorted(hooks() - set(rows)), sorted(set(rows) - hooks())
    assert not missing, f"docs/models.md's hooks table (The Task interface) has no row for {missing}"
    assert not stale, f"docs/models.md's hooks table has rows for {stale}, which Task does not define"


def test_the_hooks_are_read_from_the_class():
    found = hooks()
    assert {"input_kind", "preprocess", "collate", "postprocess", "output_shapes"} <= found
    assert not {"spec", "limits"} & found and not any(n.startswith("_") for n in found)


def test_models_md_calls_the_workers_classes_what_they_are():
    """`Linger` is a class, so not "the `Linger` protocol"; the backends are a closed set, so no "seam"."""
    text = " ".join(prose(ROOT / "docs" / "models.md").split())
    for cls in (Linger, Backend):
        if not getattr(cls, "_is_protocol", False):
            assert f"`{cls.__name__}` protocol" not in text, \
                f"docs/models.md calls {cls.__name__} a protocol: it is a class ({cls.__module__})"
    sentences = [s for s in re.split(r"(?<=[.;])\s", text) if "worker/backend.py" in s or "`Linger`" in s]
    assert sentences, "docs/models.md no longer says what the backends and the linger policy are"
    assert not [s for s in sentences if "seam" in s], \
        "docs/models.md calls the backends or the linger policy a seam: neither is a task's to replace"


# -- links -------------------------------------------------------------------------------------------


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    text = CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), prose(path))
    problems = []
    for match in LINK.finditer(text):
        target = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{name(path, root)}:{line}: ({target})"
        if not resolved.exists():
            problems.append(f"{where}: no such file or folder")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: {name(resolved, root)} has no heading #{anchor}")
    return problems


def citation_problems(path: Path, root: Path = ROOT) -> list[str]:
    text = prose(path)
    problems = []
    for match in CITATION.finditer(text):
        cited, title = match.group(1), " ".join(match.group(2).split())
        line = text.count("\n", 0, match.start()) + 1
        target = next((c for c in ((path.parent / cited).resolve(), root / cited) if c.is_file()), None)
        if target is None:
            problems.append(f"{name(path, root)}:{line}: cites {cited}, which does not exist")
        elif not any(h == title or h.split(":")[0] == title for h in headings(target)):
            problems.append(f"{name(path, root)}:{line}: cites {cited}, \"{title}\": no such heading there")
    return problems


@pytest.mark.parametrize("path", documents(), ids=name)
def test_every_link_resolves(path):
    problems = link_problems(path)
    assert not problems, "links that lead nowhere:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", documents(), ids=name)
def test_every_section_cited_by_title_exists(path):
    problems = citation_problems(path)
    assert not problems, "sections cited that are not there:\n" + "\n".join(problems)


def test_the_link_check_reads_anchors_as_github_does(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# On a GPU (H100, H200)\n\n## Ready tensors on `/v2`: model.json's `inputs`\n\n"
                    "```sh\n# not a heading\n```\n\n## Notes\n\n## Notes\n\n## The [jobs](jobs.md) – in short\n",
                    encoding="utf-8")
    assert anchors(page) == {"on-a-gpu-h100-h200", "ready-tensors-on-v2-modeljsons-inputs", "notes", "notes-1",
                             "the-jobs--in-short"}
    other = tmp_path / "other.md"
    other.write_text("[a](page.md#notes-1) [b](#nope) [c](missing/) `[d](#nope)` [e](https://example.com/#x)\n"
                     "(page.md, \"On a GPU\n(H100)\") page.md (\"Ready tensors on /v2\")\n", encoding="utf-8")
    assert [p.split(": ", 2)[2] for p in link_problems(other, tmp_path)] == [
        "other.md has no heading #nope", "no such file or folder"]
    assert [p.split(": ", 1)[1] for p in citation_problems(other, tmp_path)] == [
        'cites page.md, "On a GPU (H100)": no such heading there']


# -- wire format -------------------------------------------------------------------------------------


def job_keys() -> set[str]:
    """The Job dataclass's fields and every key encode_job writes, every optional field set."""
    tensor = {"x": np.zeros(2, np.float32)}
    keys = {f.name for f in dataclasses.fields(wire.Job)}
    for items in ([tensor], [tensor, tensor]):
        job = wire.Job(id="j", model="m", items=items, reply_to="r", deadline=1, raw=True, version=2,
                       trace="00-1-2-01", request_id="q", priority="high", cache="shared:ab",
                       contexts=[{"size": 1}] * len(items))
        keys |= set(msgpack.unpackb(wire.encode_job(job), raw=False))
    return keys


def reply_keys() -> set[str]:
    keys = set()
    for reply in (wire.Reply(id="j", ok=True, outputs={"y": 1}), wire.Reply(id="j", ok=True, items=[{}, {}]),
                  wire.Reply(id="j", ok=False, error={"code": "c", "message": "m"}, item=0)):
        encoded = msgpack.unpackb(wire.encode_reply(reply), raw=False)
        keys |= set(encoded) | set(encoded.get("error", {}))
    return keys


def wire_section() -> str:
    return section(ROOT / "docs" / "architecture.md", "Wire format")


def named_in_code(text: str) -> set[str]:
    """Every word inside the text's code spans."""
    return {word for match in CODE_SPAN.finditer(text) for word in re.findall(r"\w+", match.group(0))}


def test_the_wire_format_names_every_field_a_job_and_a_reply_carry():
    named = named_in_code(wire_section())
    missing_job, missing_reply = sorted(job_keys() - named), sorted(reply_keys() - named)
    assert not missing_job, f"docs/architecture.md's Wire format does not name the job's fields {missing_job}"
    assert not missing_reply, f"docs/architecture.md's Wire format does not name the reply's fields {missing_reply}"


def test_the_wire_format_lists_every_job_format_the_code_knows():
    listed = {int(n): line for n, line in
              ((m.group(1), m.group(0)) for m in re.finditer(r"^\s*- format (\d+)\b.*$", wire_section(), re.M))}
    assert set(listed) == set(range(1, wire.JOB_FORMAT + 1)), (
        f"docs/architecture.md's Wire format lists job formats {sorted(listed)}; "
        f"the code knows 1 to JOB_FORMAT = {wire.JOB_FORMAT}")
    assert "CONTEXT_FORMAT" in listed[wire.CONTEXT_FORMAT], \
        f"docs/architecture.md's line of format {wire.CONTEXT_FORMAT} does not say it is CONTEXT_FORMAT"
    assert "`JOB_FORMAT`" in wire_section(), "docs/architecture.md's Wire format does not name JOB_FORMAT"


def test_the_job_fields_are_read_from_the_code():
    keys = job_keys()
    assert {"v", "n", "id", "inputs", "items", "contexts", "cache", "priority"} <= keys


# -- peers and GPUs ----------------------------------------------------------------------------------

PEERS = ("service-streamer", "LitServe", "infinity", "Ray Serve", "Flask")
GPUS = ("H100", "H200")


def where_benchmarks_are_listed() -> dict[str, str]:
    """README.md's "Read on" row of docs/performance.md, and docs/development.md's "Tests and benchmarks"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    row = [line for line in readme if line.startswith("| [docs/performance.md]")]
    assert len(row) == 1, "README.md's Read on table has no one row for docs/performance.md"
    return {"README.md's Read on row of docs/performance.md": row[0],
            "docs/development.md's Tests and benchmarks": section(ROOT / "docs" / "development.md",
                                                                   "Tests and benchmarks")}


@pytest.mark.parametrize("place", ["README.md", "docs/development.md"])
def test_the_benchmark_peers_and_gpus_are_all_named(place):
    where, text = next((w, t) for w, t in where_benchmarks_are_listed().items() if w.startswith(place))
    text = " ".join(text.split())
    missing = [word for word in (*PEERS, *GPUS) if word not in text]
    assert not missing, f"{where} does not name {missing} among the peers and GPUs measured"


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 150, f"README.md is {lines} lines, over 150"
