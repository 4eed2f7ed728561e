"""Error codes and API keys are written by name (``ErrorCode.NOT_COORDINATOR``,
``ApiKey.API_VERSIONS``), never as bare numbers, outside the generated modules that define them.

An AST check over every hand-written module under ``src/kcore``. It flags:

- an equality or membership test of an error code or API key (a name or attribute called
  ``code``, ``api_key`` or ending in ``_code``) against a numeric literal, or a tuple, list or set
  holding one (ordering comparisons are left alone: HTTP status ranges are not Kafka codes);
- a numeric API key given to the calls that take one: ``version_for``, ``version``,
  ``_send_any``; a numeric error code given to ``error_for_code``, ``error_name``,
  ``handle_error`` or ``handle_error_code``;
- a ``default`` of such a lookup given as a number: ``next((r.error_code ...), 0)``;
- a keyword argument ``error_code=`` / ``api_key=`` given a numeric literal;
- a module constant named after an ``ErrorCode`` or ``ApiKey`` member (or the first words of one,
  with an optional ``_KEY`` / ``_CODE`` suffix: ``UNKNOWN_TOPIC = 3``, ``API_VERSIONS_KEY = 18``)
  whose value is that member's number;
- a module constant named ``*_CODES`` / ``*_KEYS`` whose value holds numeric literals, or one
  tested with ``code in NAME`` in its module whose numbers are all Kafka error codes (HTTP
  statuses are not).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcore.errors import ErrorCode
from kcore.protocol import ApiKey

SRC = Path(__file__).resolve().parent.parent / "src" / "kcore"
GENERATED = (SRC / "protocol" / "messages", SRC / "errors" / "_codes.py")

ERROR_CODES = frozenset(m.value for m in ErrorCode)
MEMBERS: dict[str, int] = {
    **{m.name: m.value for m in ErrorCode},
    **{m.name: m.value for m in ApiKey},
}


EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
# Calls whose positional arguments include an API key (a node id, the other one, is never a
# literal).
TAKES_API_KEY = frozenset({"version_for", "version", "_send_any"})
TAKES_ERROR_CODE = frozenset({"error_for_code", "error_name", "handle_error", "handle_error_code"})


def _call_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def hand_written_modules() -> list[Path]:
    return sorted(
        p for p in SRC.rglob("*.py") if not any(p == g or g in p.parents for g in GENERATED)
    )


def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    )


def _number(node: ast.AST) -> int | None:
    if not _is_number(node):
        return None
    if isinstance(node, ast.UnaryOp):
        return -int(node.operand.value)  # type: ignore[attr-defined]
    return int(node.value)  # type: ignore[attr-defined]


def _holds_numbers(node: ast.AST) -> bool:
    """A number, or a literal collection (or ``frozenset(...)`` / ``set(...)`` of one) with a
    number among its elements or keys."""
    if _is_number(node):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_number(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _is_number(k) for k in node.keys)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("frozenset", "set", "tuple") and any(
            _holds_numbers(a) for a in node.args
        )
    return False


def _numbers_in(node: ast.AST) -> list[int]:
    """The numeric literals anywhere in an expression."""
    return [n for n in map(_number, ast.walk(node)) if n is not None]


def _is_code(node: ast.AST) -> bool:
    """An expression that, by its name, holds an error code or an API key."""
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    else:
        return False
    name = name.lower()
    return name in ("code", "api_key") or name.endswith("_code")


def _constant_matches(name: str, value: int) -> str | None:
    """The member a module constant spells out (fully, or its first words), if it has its value."""
    for suffix in ("_KEY", "_CODE", ""):
        stem = name.removesuffix(suffix) if suffix else name
        for member, number in MEMBERS.items():
            if number == value and (member == stem or member.startswith(stem + "_")):
                return member
    return None


def _module_assignments(tree: ast.Module) -> Iterator[tuple[int, str, ast.AST]]:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            pairs: list[tuple[ast.AST, ast.AST]] = []
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs.extend(zip(target.elts, node.value.elts, strict=False))
                else:
                    pairs.append((target, node.value))
            for target, value in pairs:
                if isinstance(target, ast.Name):
                    yield node.lineno, target.id, value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if isinstance(node.target, ast.Name):
                yield node.lineno, node.target.id, node.value


def bare_codes(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every bare error code or API key in a module's source."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    code_sets: set[str] = set()  # names of collections that codes are looked up in
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if not all(isinstance(op, EQUALITY) for op in node.ops):
                continue
            operands = [node.left, *node.comparators]
            if _is_code(node.left):
                code_sets.update(
                    c.id
                    for op, c in zip(node.ops, node.comparators, strict=True)
                    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(c, ast.Name)
                )
            if any(_is_code(o) for o in operands) and any(
                _holds_numbers(o) for o in operands if not _is_code(o)
            ):
                found.append((node.lineno, "code compared with a number"))
        elif isinstance(node, ast.Call):
            if _call_name(node) in TAKES_API_KEY and any(_is_number(a) for a in node.args):
                found.append((node.lineno, f"{_call_name(node)}() given a numeric API key"))
            if _call_name(node) in TAKES_ERROR_CODE and node.args and _is_number(node.args[0]):
                found.append((node.lineno, f"{_call_name(node)}() given a numeric error code"))
            for kw in node.keywords:
                if kw.arg in ("error_code", "api_key") and _is_number(kw.value):
                    found.append((node.lineno, f"{kw.arg}= given a number"))
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "next"
                and len(node.args) == 2
                and isinstance(node.args[0], ast.GeneratorExp)
                and _is_code(node.args[0].elt)
                and _is_number(node.args[1])
            ):
                found.append((node.lineno, "a code's default given as a number"))
    for lineno, name, value in _module_assignments(tree):
        number = _number(value)
        member = _constant_matches(name, number) if number is not None else None
        if member is not None:
            found.append((lineno, f"{name} = {number} spells out {member}"))
        elif name.endswith(("_CODES", "_KEYS")) and _holds_numbers(value):
            found.append((lineno, f"{name} holds bare numbers"))
        elif name in code_sets and _holds_numbers(value):
            numbers = _numbers_in(value)
            if numbers and all(n in ERROR_CODES for n in numbers):
                found.append((lineno, f"{name} holds bare error codes"))
    return sorted(found)


@pytest.mark.parametrize(
    "source",
    [
        "if p.error_code == 0: pass",
        "if code != -1: pass",
        "ok = p.error_code in (0, 84)",
        "ok = top_code not in {3, ErrorCode.NONE}",
        "ok = 18 == api_key",
        "v = conn.version_for(17, max_version=1)",
        "v = await cluster.version_for(node, 3)",
        "v = await link.version(68)",
        "r = await self._send_any(build, 19)",
        "e = error_for_code(3) or KafkaError()",
        "f(api_key=18)",
        "c = next((r.error_code for r in rs), 0)",
        "UNKNOWN_MEMBER_ID = 25",
        "API_VERSIONS_KEY = 18",
        "UNKNOWN_TOPIC = 3",
        "LIST_GROUPS, DELETE_RECORDS = 16, 21",
        "X: int = 69\nCONSUMER_GROUP_DESCRIBE: int = 69",
        "STALE_METADATA_CODES = frozenset({3, 6})",
        "RETRY_CODES = {6: 'x'}",
        "TOO_LARGE = frozenset({10, 18})\nok = code in TOO_LARGE",
    ],
)
def test_the_check_finds_bare_codes(source: str) -> None:
    assert bare_codes(source)


@pytest.mark.parametrize(
    "source",
    [
        "if p.error_code == ErrorCode.NONE: pass",
        "ok = code in (ErrorCode.NONE, ErrorCode.ELECTION_NOT_NEEDED)",
        "if proc.returncode != 0: pass",  # not a Kafka code
        "if offset == -1: pass",
        "if 300 <= exc.code < 400: pass",  # an HTTP status
        "v = await cluster.version_for(node, ApiKey.FETCH, min_version=3)",
        "LEAVE_EPOCH = -1",
        "UNKNOWN_TOPIC = 4",  # a number other than the member's
        "class ResourceType:\n    TOPIC = 2",
        "MAX_EPOCH = 2**31 - 1",
        "SIZES = (1, 2)\nok = size in SIZES",
        "HTTP = frozenset([*range(400, 408), 501])\nok = exc.code in HTTP",
    ],
)
def test_the_check_leaves_other_numbers(source: str) -> None:
    assert bare_codes(source) == []


def test_no_bare_codes_in_src() -> None:
    problems = [
        f"{path.relative_to(SRC.parent)}:{lineno}: {what}"
        for path in hand_written_modules()
        for lineno, what in bare_codes(path.read_text(encoding="utf-8"))
    ]
    assert not problems, "use ErrorCode / ApiKey names:\n" + "\n".join(problems)
