"""One name, one meaning (docs/architecture.md, "Glossary"), kept by reading the package's source:

- no type name (a class, or a module-level alias or TypeVar) is defined in two of its modules;
- each type the glossary names is defined in the package, once;
- a constructor whose arguments hold two of one type side by side takes them by keyword only
  (`JobQueue(model=..., worker_id=...)`), where a swap would pass every type check;
- no function in web/, worker/ or common/ silences ruff's argument or statement counts.
"""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "web", "worker", "scripts")
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # protoc's output (web/grpc/)


def modules() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.name.endswith(GENERATED):
                yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def type_names(tree: ast.Module) -> Iterator[str]:
    """The module's classes, TypeVars, and module-level aliases (a capitalized name bound to a type:
    not a CONSTANT)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            value = node.value
            typevar = isinstance(value, ast.Call) and ast.unparse(value.func).endswith(("TypeVar", "NewType"))
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name) and (typevar or target.id[:1].isupper() and not target.id.isupper()):
                    yield target.id


def test_no_type_name_is_defined_twice():
    where = collections.defaultdict(set)
    for path, tree in modules():
        for name in type_names(tree):
            where[name].add(str(path))
    twice = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"type names defined in more than one module (rename one): {twice}"


def glossary() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("\n## Glossary\n")
    return text[start:text.index("\n## ", start + 1)]


def test_each_type_the_glossary_names_is_defined_once():
    named = set(re.findall(r"`([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)`", glossary()))
    where = collections.Counter(name for _, tree in modules() for name in type_names(tree))
    assert len(named) > 15, named
    assert not {name for name in named if where[name] != 1}, {name: where[name] for name in named if where[name] != 1}


def is_dataclass(node: ast.ClassDef) -> tuple[bool, bool]:
    """Whether the class is a dataclass, and whether its fields are keyword-only."""
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        name = (call.func if call else decorator)
        if ast.unparse(name) in ("dataclass", "dataclasses.dataclass"):
            return True, bool(call) and any(k.arg == "kw_only" and ast.literal_eval(k.value) for k in call.keywords)
    return False, False


def dataclass_fields(node: ast.ClassDef) -> list[tuple[str, str]]:
    """A dataclass's positional fields, in order, with their annotations: up to a KW_ONLY marker,
    without ClassVars and fields that are out of __init__ or keyword-only."""
    fields = []
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        annotation = ast.unparse(statement.annotation)
        if annotation.endswith("KW_ONLY"):
            break
        value = statement.value
        keywords = {k.arg: ast.unparse(k.value) for k in value.keywords} if isinstance(value, ast.Call) else {}
        if "ClassVar" in annotation or keywords.get("init") == "False" or keywords.get("kw_only") == "True":
            continue
        fields.append((statement.target.id, annotation))
    return fields


def init_arguments(node: ast.ClassDef) -> list[tuple[str, str]]:
    """The positional arguments of a class's own __init__ (without self), with their annotations."""
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            arguments = [*statement.args.posonlyargs, *statement.args.args][1:]
            return [(a.arg, ast.unparse(a.annotation) if a.annotation else "?" + a.arg) for a in arguments]
    return []


def test_constructors_take_two_of_one_type_by_keyword():
    side_by_side = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            dataclass, kw_only = is_dataclass(node)
            arguments = [] if kw_only else dataclass_fields(node) if dataclass else init_arguments(node)
            side_by_side += [f"{path}:{node.lineno} {node.name}({a}, {b}: {kind})"
                             for (a, kind), (b, other) in zip(arguments, arguments[1:]) if kind == other]
    assert not side_by_side, ("constructors with two arguments of one type side by side, positional (make "
                              "them keyword-only: `*,`, or @dataclass(kw_only=True)):\n" + "\n".join(side_by_side))


def test_no_function_silences_the_argument_or_statement_counts():
    silenced = [f"{path}:{number}" for package in ("common", "web", "worker")
                for path in sorted((ROOT / package).rglob("*.py"))
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if "noqa" in line and ("PLR0913" in line or "PLR0915" in line)]
    assert not silenced, f"group the arguments, or split the function: {silenced}"


def test_the_checks_see_what_they_look_for():
    """The walks above find what they must (a check that reads nothing passes anything)."""
    tree = ast.parse("@dataclass\nclass A:\n    x: int\n    y: int\n"
                     "class B:\n    def __init__(self, a: str, b: str, *, c: str): ...\n"
                     "T = TypeVar('T')\nLIMIT = 3\n")
    a, b = (node for node in tree.body if isinstance(node, ast.ClassDef))
    assert dataclass_fields(a) == [("x", "int"), ("y", "int")] and is_dataclass(a) == (True, False)
    qualified = ast.parse("@dataclasses.dataclass(kw_only=True)\nclass C:\n    x: int\n").body[0]
    assert isinstance(qualified, ast.ClassDef) and is_dataclass(qualified) == (True, True)
    assert init_arguments(b) == [("a", "str"), ("b", "str")]
    assert list(type_names(tree)) == ["A", "B", "T"]
    assert sum(1 for _ in modules()) > 100
