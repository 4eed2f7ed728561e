"""Generate ``src/kcore/errors/_codes.py``, one ``KafkaError`` subclass per Kafka protocol error
code, from the ``org.apache.kafka.common.protocol.Errors`` enum in the kafka-clients jar.

``tools/ListKafkaErrors.java`` reads the enum (run with ``java`` in source-file mode, no build
step) and prints one JSON object per code; this script turns that into Python source. The output
depends only on the jar, so it is byte-for-byte reproducible.

    python tools/generate_errors.py            # (re)write src/kcore/errors/_codes.py
    python tools/generate_errors.py --check    # exit 1 if the committed file is stale
    python tools/generate_errors.py --jar path/to/kafka-clients-X.Y.Z.jar

Without ``--jar`` the jar of ``kcore.testing.versions.PROTOCOL_SOURCE_VERSION`` is fetched with
Maven (cached, see ``tools/kafka_jar.py``); so is slf4j-api, which ``Errors`` logs through.

Class names are the enum name in CamelCase with an ``Error`` suffix; a trailing ``_ERROR`` or
``_EXCEPTION`` in the enum name becomes that suffix rather than doubling it
(``UNKNOWN_SERVER_ERROR`` -> ``UnknownServerError``, ``NETWORK_EXCEPTION`` -> ``NetworkError``).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make ``tools`` importable
    sys.path.insert(0, str(REPO))

from tools.kafka_jar import kafka_clients_jar, maven_jar  # noqa: E402

LISTER = REPO / "tools" / "ListKafkaErrors.java"
BASE = REPO / "src" / "kcore" / "errors" / "_base.py"
VERSIONS = REPO / "src" / "kcore" / "testing" / "versions.py"
OUTPUT = REPO / "src" / "kcore" / "errors" / "_codes.py"

LINE_LENGTH = 100

# Names _codes.py defines besides the per-code classes; a generated class must not take one.
FIXED_NAMES = (
    "ERRORS_BY_CODE",
    "ERRORS_BY_NAME",
    "ErrorCode",
    "RETRIABLE_CODES",
    "UnknownKafkaErrorCode",
    "error_for_code",
)


class GeneratorError(Exception):
    """The enum read from the jar cannot be turned into a valid, unambiguous module."""


@dataclass(frozen=True)
class KafkaErrorCode:
    code: int
    name: str
    retriable: bool
    message: str
    exception: str

    @property
    def class_name(self) -> str:
        return class_name_for(self.name)


def class_name_for(enum_name: str) -> str:
    """``NOT_LEADER_OR_FOLLOWER`` -> ``NotLeaderOrFollowerError``; a trailing ``ERROR`` or
    ``EXCEPTION`` word is replaced by the ``Error`` suffix instead of doubling it."""
    words = [w for w in enum_name.split("_") if w]
    if len(words) > 1 and words[-1] in ("ERROR", "EXCEPTION"):
        words = words[:-1]
    return "".join(w[0].upper() + w[1:].lower() for w in words) + "Error"


# --- reading the enum -------------------------------------------------------------------------


def _module_constant(path: Path, name: str) -> str:
    """A top-level ``NAME = "literal"`` from a module, read without importing the package."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise GeneratorError(f"{path}: no string constant {name}")


def jar_kafka_version(jar: Path) -> str:
    """The release a kafka-clients jar was built from (``kafka/kafka-version.properties``)."""
    with zipfile.ZipFile(jar) as zf:
        text = zf.read("kafka/kafka-version.properties").decode("utf-8")
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version":
            return value.strip()
    raise GeneratorError(f"{jar}: no version in kafka/kafka-version.properties")


def java_command() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise GeneratorError("java (17+) not found; set JAVA_HOME or put it on PATH")
    return java


def run_lister(classpath: Sequence[Path]) -> str:
    proc = subprocess.run(
        [java_command(), "-cp", os.pathsep.join(map(str, classpath)), str(LISTER)],
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    if proc.returncode != 0:
        raise GeneratorError(
            f"{LISTER.name} failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc.stdout


def parse_listing(text: str) -> list[KafkaErrorCode]:
    """Rows of the lister's JSON lines, NONE (code 0) dropped, sorted by code."""
    rows: list[KafkaErrorCode] = []
    saw_none = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            code, name, retriable = obj["code"], obj["name"], obj["retriable"]
            message, exception = obj["message"], obj["exception"]
        except (ValueError, KeyError, TypeError) as e:
            raise GeneratorError(f"line {lineno}: cannot parse {line!r}: {e}") from e
        if not (
            isinstance(code, int)
            and not isinstance(code, bool)
            and isinstance(name, str)
            and isinstance(retriable, bool)
        ):
            raise GeneratorError(f"line {lineno}: bad field types in {line!r}")
        if code == 0:
            if name != "NONE" or exception is not None:
                raise GeneratorError(f"code 0 is {name} ({exception}), expected NONE (no error)")
            saw_none = True
            continue
        if not isinstance(message, str) or not isinstance(exception, str):
            raise GeneratorError(f"line {lineno}: {name} has no exception or message")
        rows.append(KafkaErrorCode(code, name, retriable, message, exception))
    if not saw_none:
        raise GeneratorError("the listing has no NONE (0) row; is this Kafka's Errors enum?")
    rows.sort(key=lambda r: r.code)
    validate(rows)
    return rows


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def validate(rows: Sequence[KafkaErrorCode]) -> None:
    """Fail loudly on anything that would make the generated module ambiguous or shadow a name:
    duplicate codes, enum names or class names; a class name already defined in ``_base.py``
    (``KafkaError``, ``CorruptRecordError``, ...), used by ``_codes.py`` itself, or a Python
    builtin (``TimeoutError``...)."""
    problems: list[str] = []
    reserved = {n: f"already defined in {BASE.relative_to(REPO)}" for n in _top_level_names(BASE)}
    reserved.update({n: "defined by _codes.py itself" for n in FIXED_NAMES})
    reserved.update({n: "a Python builtin" for n in dir(builtins)})
    seen_codes: dict[int, str] = {}
    seen_names: set[str] = set()
    seen_classes: dict[str, str] = {}
    for row in rows:
        if row.code in seen_codes:
            problems.append(f"code {row.code} used by both {seen_codes[row.code]} and {row.name}")
        seen_codes[row.code] = row.name
        if row.name in seen_names:
            problems.append(f"enum name {row.name} appears twice")
        if not row.name.isidentifier() or row.name.startswith("_") or row.name == "NONE":
            problems.append(f"{row.name}: not usable as an ErrorCode member name")
        seen_names.add(row.name)
        cls = row.class_name
        if not cls.isidentifier():
            problems.append(f"{row.name}: class name {cls!r} is not a Python identifier")
        if cls in reserved:
            problems.append(f"{row.name}: class name {cls} collides with a name {reserved[cls]}")
        if cls in seen_classes:
            problems.append(f"{row.name} and {seen_classes[cls]} both map to class name {cls}")
        seen_classes[cls] = row.name
    if "UNKNOWN_SERVER_ERROR" not in seen_names:
        problems.append("no UNKNOWN_SERVER_ERROR, which unknown codes fall back to")
    if problems:
        raise GeneratorError("cannot generate _codes.py:\n  " + "\n  ".join(problems))


# --- writing the module -----------------------------------------------------------------------


def _literal(s: str) -> str:
    """A double-quoted Python literal for ``s`` (JSON string syntax is valid Python for it)."""
    lit = json.dumps(s, ensure_ascii=True)
    if ast.literal_eval(lit) != s:  # pragma: no cover - guards the claim above
        raise GeneratorError(f"cannot quote {s!r}")
    return lit


def _string_expr(s: str, indent: int, prefix_len: int) -> str:
    """``s`` as one literal if it fits after ``prefix_len`` characters, else as implicitly
    concatenated literals in parentheses, one per line, split after spaces."""
    one = _literal(s)
    if indent + prefix_len + len(one) <= LINE_LENGTH:
        return one
    pad = " " * (indent + 4)
    width = LINE_LENGTH - len(pad) - 2  # the quotes
    chunks: list[str] = []
    current = ""
    for word in s.split(" "):
        piece = word if not current else " " + word
        if current and len(_literal(current + piece + " ")) - 2 > width:
            chunks.append(current + " ")
            current = word
        else:
            current += piece
    chunks.append(current)
    assert "".join(chunks) == s
    return "(\n" + "".join(f"{pad}{_literal(c)}\n" for c in chunks) + " " * indent + ")"


def _docstring(row: KafkaErrorCode) -> str:
    """The class docstring, indented, wrapped to the line length, with a blank line after."""
    text = f"{row.name} ({row.code}), ``{row.exception}`` in the Java client."
    if row.retriable:
        text += " Retriable."
    if 4 + 3 + len(text) + 3 <= LINE_LENGTH:
        return f'    """{text}"""\n\n'
    lines = textwrap.wrap(text, width=LINE_LENGTH - 4 - 3, break_on_hyphens=False)
    body = "\n".join(("    " if i else '    """') + line for i, line in enumerate(lines))
    return f'{body}\n    """\n\n'


HEADER = '''\
"""Kafka protocol error codes as exceptions: one ``KafkaError`` subclass per code.

GENERATED by tools/generate_errors.py from Apache Kafka {version}'s
``org.apache.kafka.common.protocol.Errors``; do not edit. Regenerate with
``python tools/generate_errors.py`` after bumping ``PROTOCOL_SOURCE_VERSION``.

``ErrorCode`` names every code, NONE (0) included, as the Java enum does
(``ErrorCode.NOT_COORDINATOR == 16``). Each class carries the Java enum's ``code``, ``name``,
``retriable`` (the Java exception extends ``RetriableException``) and ``default_message``. NONE
(0) has no class: ``error_for_code(0)`` is ``None``. A code this table does not know (a newer
broker) maps to ``UnknownKafkaErrorCode``, a subclass of ``UnknownServerError`` (as the Java
client treats unknown codes) whose instances keep the real code.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from ._base import KafkaError

'''

ENUM_HEADER = '''

class ErrorCode(IntEnum):
    """Every error code of Kafka's ``Errors`` enum by its Java name. Members are ints, so they
    compare with the codes in decoded responses as they are."""

'''

FOOTER = '''

class UnknownKafkaErrorCode(UnknownServerError):
    """An error code this table does not know, probably from a broker newer than Kafka {version}.
    Caught by ``except UnknownServerError``; ``code`` is the code the broker sent, ``name`` stays
    ``UNKNOWN_SERVER_ERROR`` and ``retriable`` is False."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().__init__(message or f"Unknown error code {{code}} (not in Kafka {version}).")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.code, self.message), self.__dict__

    def with_message(self, message: str) -> KafkaError:
        return type(self)(self.code, message)


ERRORS_BY_CODE: dict[int, type[KafkaError]] = {{
{by_code}
}}
"""Every known error code except NONE (0), to its exception class."""

ERRORS_BY_NAME: dict[str, type[KafkaError]] = {{cls.name: cls for cls in ERRORS_BY_CODE.values()}}
"""The same classes by Java enum name, e.g. ``"NOT_LEADER_OR_FOLLOWER"``."""

RETRIABLE_CODES: frozenset[int] = frozenset({{
{retriable}
}})
"""The codes whose errors are worth retrying (after a metadata refresh or backoff)."""


def error_for_code(code: int, message: str | None = None) -> KafkaError | None:
    """The exception for a broker's error code, ready to raise; ``None`` for 0 (no error).
    ``message`` (the response's error message, if any) replaces the default message. A code
    not in this table gives an ``UnknownKafkaErrorCode`` carrying it."""
    if code == ErrorCode.NONE:
        return None
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        return UnknownKafkaErrorCode(code, message)
    return cls(message)
'''


def _wrapped_ints(values: Sequence[int]) -> str:
    return textwrap.fill(
        " ".join(f"{v}," for v in values),
        width=LINE_LENGTH,
        initial_indent="    ",
        subsequent_indent="    ",
        break_on_hyphens=False,
    )


def render(rows: Sequence[KafkaErrorCode], version: str) -> str:
    validate(rows)
    names = [r.class_name for r in rows]
    out = [HEADER.format(version=version)]
    out.append("__all__ = [\n")
    out.extend(f'    "{n}",\n' for n in [*sorted(names), *FIXED_NAMES])
    out.append("]\n")
    out.append(ENUM_HEADER)
    members = sorted([*((r.code, r.name) for r in rows), (0, "NONE")])
    out.extend(f"    {name} = {code}\n" for code, name in members)
    for row in rows:
        out.append(f"\n\nclass {row.class_name}(KafkaError):\n")
        out.append(_docstring(row))
        out.append(f"    code = {row.code}\n")
        out.append(f"    name = {_literal(row.name)}\n")
        out.append(f"    retriable = {row.retriable}\n")
        prefix = "default_message = "
        out.append(f"    {prefix}{_string_expr(row.message, 4, len(prefix))}\n")
    by_code = "\n".join(f"    {r.code}: {r.class_name}," for r in rows)
    retriable = _wrapped_ints([r.code for r in rows if r.retriable])
    out.append(FOOTER.format(version=version, by_code=by_code, retriable=retriable))
    return "".join(out)


def generate(jar: Path, slf4j_jar: Path) -> str:
    rows = parse_listing(run_lister([jar, slf4j_jar]))
    return render(rows, jar_kafka_version(jar))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--jar",
        type=Path,
        help="kafka-clients jar (default: fetch PROTOCOL_SOURCE_VERSION's with Maven)",
    )
    parser.add_argument(
        "--slf4j-jar",
        type=Path,
        help="slf4j-api jar (default: fetch kcore.testing.versions.SLF4J_VERSION's with Maven)",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help="default: %(default)s")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the output file differs from what would be generated",
    )
    args = parser.parse_args(argv)

    jar: Path = args.jar or kafka_clients_jar(_module_constant(VERSIONS, "PROTOCOL_SOURCE_VERSION"))
    slf4j: Path = args.slf4j_jar or maven_jar(
        "org.slf4j", "slf4j-api", _module_constant(VERSIONS, "SLF4J_VERSION")
    )
    try:
        text = generate(jar, slf4j)
    except GeneratorError as e:
        print(f"generate_errors: {e}", file=sys.stderr)
        return 2
    output: Path = args.output
    current = output.read_text(encoding="utf-8") if output.exists() else None
    if args.check:
        if current != text:
            print(
                f"{output} is stale (or missing) for {jar.name}; "
                "run python tools/generate_errors.py",
                file=sys.stderr,
            )
            return 1
        print(f"{output} is up to date with {jar.name}")
        return 0
    if current != text:
        output.write_text(text, encoding="utf-8")
        print(f"wrote {output}")
    else:
        print(f"{output} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
