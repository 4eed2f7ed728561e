"""Generate ``src/kcore/protocol/messages/`` from Apache Kafka's JSON message definitions.

Kafka ships one JSON file (with ``//`` comments) per message inside the kafka-clients jar under
``common/message/``. This script reads every one of them and writes one Python module per file
(``MetadataRequest.json`` -> ``metadata_request.py``) plus a registry ``__init__.py``.

Usage::

    python tools/generate_protocol.py            # (re)write src/kcore/protocol/messages/
    python tools/generate_protocol.py --check    # exit 1 and name the stale files, if any
    python tools/generate_protocol.py --jar PATH --out DIR

Shape of the generated code (see ``kcore.protocol.types`` for the helpers it calls): for every
struct one class (``__slots__``, keyword ``__init__``) and one module-level encode and decode
function. Those functions switch on the version only where the wire layout changes; each branch
is straight-line code, adjacent fixed-width fields are read and written with one precompiled
``struct.Struct``, and tagged fields are dispatched in one loop at the end of the struct.
"""

from __future__ import annotations

import argparse
import difflib
import json
import keyword
import re
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "src" / "kcore" / "protocol" / "messages"
LINE_LENGTH = 100
MAX_VERSION = 0x7FFF  # the "+" of an open version range; versions are int16 on the wire
INDENT = "    "

# ---------------------------------------------------------------------------------------------
# Reading the schema


def strip_json_comments(text: str) -> str:
    """Drop ``//`` comments (Kafka's JSON dialect), leaving ``//`` inside strings alone."""
    out: list[str] = []
    i, n, in_string = 0, len(text), False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def read_jar_sources(jar: Path) -> dict[str, str]:
    """``{"MetadataRequest.json": text, ...}`` for every message definition in the jar.

    Current jars keep them under ``common/message/``; older builds used the Java package path
    ``org/apache/kafka/common/message/``. Accept both."""
    sources: dict[str, str] = {}
    with zipfile.ZipFile(jar) as zf:
        for name in zf.namelist():
            if name.endswith(".json") and re.search(r"(^|/)common/message/[^/]+$", name):
                sources[name.rsplit("/", 1)[1]] = zf.read(name).decode("utf-8")
    if not sources:
        raise SystemExit(f"{jar}: no common/message/*.json files found")
    return sources


@dataclass(frozen=True)
class Versions:
    """An inclusive version range; empty when ``lo > hi`` (the schema's "none")."""

    lo: int
    hi: int

    @staticmethod
    def parse(text: str | None) -> Versions:
        if text is None or text.strip() == "none":
            return NO_VERSIONS
        text = text.strip()
        if text.endswith("+"):
            return Versions(int(text[:-1]), MAX_VERSION)
        if "-" in text:
            lo, hi = text.split("-")
            return Versions(int(lo), int(hi))
        return Versions(int(text), int(text))

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.lo <= version <= self.hi

    def __and__(self, other: Versions) -> Versions:
        r = Versions(max(self.lo, other.lo), min(self.hi, other.hi))
        return r if not r.empty else NO_VERSIONS

    def hull(self, other: Versions) -> Versions:
        if self.empty:
            return other
        if other.empty:
            return self
        return Versions(min(self.lo, other.lo), max(self.hi, other.hi))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.lo, self.hi + 1))

    def as_tuple(self) -> tuple[int, int] | None:
        return None if self.empty else (self.lo, self.hi)

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.hi == MAX_VERSION:
            return f"{self.lo}+"
        return f"{self.lo}" if self.lo == self.hi else f"{self.lo}-{self.hi}"


NO_VERSIONS = Versions(1, 0)

# Fixed-width primitives: struct format code, size.
FIXED_TYPES: dict[str, tuple[str, int]] = {
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "bool": ("?", 1),
}
# Struct-name fragments for module-level ``struct.Struct`` constants ("?" is not an identifier).
FORMAT_NAMES = {
    "b": "i8",
    "h": "i16",
    "H": "u16",
    "i": "i32",
    "I": "u32",
    "q": "i64",
    "d": "f64",
    "?": "bool",
}
PRIMITIVES = set(FIXED_TYPES) | {"string", "bytes", "records", "uuid"}

# Word breaks the mechanical CamelCase -> snake_case rule gets wrong.
SNAKE_OVERRIDES = {"KRaft": "Kraft", "2Pc": "_2pc"}


def snake_case(name: str) -> str:
    for old, new in SNAKE_OVERRIDES.items():
        name = name.replace(old, new)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s).lower()
    return s + "_" if keyword.iskeyword(s) else s


@dataclass(eq=False)  # identity: specs reference each other
class FieldSpec:
    name: str
    attr: str
    type: str  # as written: "int32", "[]string", "[]Topic", "Topic"
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    ignorable: bool
    default: object  # raw "default" value from the JSON, or None when absent
    about: str
    flexible_override: Versions | None  # a field-level "flexibleVersions"
    struct: StructSpec | None = None  # element/struct type, for struct and []struct fields

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_fixed(self) -> bool:
        return not self.is_array and self.type in FIXED_TYPES


@dataclass(eq=False)
class StructSpec:
    name: str
    fields: list[FieldSpec]
    versions: Versions  # as declared ("versions" of the field or common struct)
    about: str = ""
    context: Versions = NO_VERSIONS  # message versions in which this struct can be on the wire
    is_root: bool = False


@dataclass
class MessageSpec:
    name: str
    kind: str  # request, response, header, data, metadata
    api_key: int | None
    valid: Versions
    flexible: Versions
    latest_unstable: bool
    source: str  # the JSON file name
    root: StructSpec
    structs: list[StructSpec] = field(default_factory=list)  # definition order, root last

    @property
    def module(self) -> str:
        return snake_case(self.name)


def parse_message(filename: str, text: str) -> MessageSpec:
    data = json.loads(strip_json_comments(text))
    valid = Versions.parse(data.get("validVersions"))
    parser = _StructParser(filename)
    # Definition order: common structs (and what they nest) first, then the structs nested in
    # the message, children before parents, and the message itself last.
    commons = [
        parser.struct(raw["name"], raw["fields"], Versions.parse(raw["versions"]))
        for raw in data.get("commonStructs", [])
    ]
    root = StructSpec(data["name"], parser.fields(data.get("fields", [])), valid, is_root=True)
    structs = commons + [s for s in parser.structs if s not in commons] + [root]
    by_name: dict[str, StructSpec] = {}
    for s in structs:
        if s.name in by_name:
            raise ValueError(f"{filename}: struct {s.name} is defined twice")
        by_name[s.name] = s
    _resolve_struct_refs(filename, structs, by_name)
    spec = MessageSpec(
        name=data["name"],
        kind=data["type"],
        api_key=data.get("apiKey"),
        valid=valid,
        flexible=Versions.parse(data.get("flexibleVersions")),
        latest_unstable=bool(data.get("latestVersionUnstable", False)),
        source=filename,
        root=root,
        structs=structs,
    )
    _compute_contexts(spec)
    _validate(spec)
    return spec


class _StructParser:
    """Turns JSON field lists into specs, collecting every struct they define."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.structs: list[StructSpec] = []  # children before parents

    def struct(
        self, name: str, raw_fields: list[dict[str, Any]], versions: Versions, about: str = ""
    ) -> StructSpec:
        spec = StructSpec(name, self.fields(raw_fields), versions, about)
        self.structs.append(spec)
        return spec

    def fields(self, raw_fields: list[dict[str, Any]]) -> list[FieldSpec]:
        return [self.field(raw) for raw in raw_fields]

    def field(self, raw: dict[str, Any]) -> FieldSpec:
        name = str(raw["name"])
        flexible = raw.get("flexibleVersions")
        spec = FieldSpec(
            name=name,
            attr=snake_case(name),
            type=str(raw["type"]),
            versions=Versions.parse(raw["versions"]),
            nullable=Versions.parse(raw.get("nullableVersions")),
            tagged=Versions.parse(raw.get("taggedVersions")),
            tag=int(raw["tag"]) if "tag" in raw else None,
            ignorable=bool(raw.get("ignorable", False)),
            default=raw.get("default"),
            about=str(raw.get("about", "")),
            flexible_override=Versions.parse(flexible) if flexible is not None else None,
        )
        if "fields" in raw:
            if spec.elem in PRIMITIVES:
                raise ValueError(f"{self.filename}: primitive field {name} has nested fields")
            spec.struct = self.struct(spec.elem, raw["fields"], spec.versions, spec.about)
        return spec


def _resolve_struct_refs(
    filename: str, structs: list[StructSpec], by_name: dict[str, StructSpec]
) -> None:
    """Point fields that name a struct without defining it (``"type": "[]Foo"`` with no
    ``fields``) at the common struct of that name."""
    for s in structs:
        for f in s.fields:
            if f.elem not in PRIMITIVES and f.struct is None:
                if f.elem not in by_name:
                    raise ValueError(f"{filename}: {s.name}.{f.name}: unknown type {f.type}")
                f.struct = by_name[f.elem]


def _compute_contexts(spec: MessageSpec) -> None:
    """The message versions in which each struct can appear: the root's valid versions narrowed
    by the ``versions`` of every field on the way down. A common struct used in several places
    gets the hull of its uses. The encoders only branch on versions inside this range."""
    spec.root.context = spec.valid

    def visit(s: StructSpec) -> None:
        for f in s.fields:
            if f.struct is None:
                continue
            child = f.struct
            ctx = f.versions & s.context & child.versions
            before = child.context
            child.context = child.context.hull(ctx)
            if child.context != before:
                visit(child)

    visit(spec.root)
    for s in spec.structs:
        if s.context.empty and not spec.valid.empty:
            # Declared but unreachable in any valid version (an old field kept in the JSON):
            # still generate it, using its own declared versions clipped to something finite.
            hi = min(s.versions.hi, max(spec.valid.hi, s.versions.lo))
            s.context = Versions(s.versions.lo, hi)


def _validate(spec: MessageSpec) -> None:
    """Refuse schema features this generator does not implement instead of guessing."""
    for s in spec.structs:
        tags: dict[int, str] = {}
        attrs: set[str] = set()
        for f in s.fields:
            where = f"{spec.source}: {s.name}.{f.name}"
            if f.attr in attrs or f.attr.startswith("_"):
                raise ValueError(f"{where}: attribute name {f.attr} clashes")
            attrs.add(f.attr)
            if f.tag is not None:
                if f.tagged.empty or f.tag in tags:
                    raise ValueError(f"{where}: bad or duplicate tag {f.tag}")
                tags[f.tag] = f.name
                if f.tagged.hi != MAX_VERSION or (f.tagged & spec.flexible) != f.tagged:
                    raise ValueError(f"{where}: tagged versions must be open and flexible")
            elif not f.tagged.empty:
                raise ValueError(f"{where}: taggedVersions without a tag")
            if f.is_array and f.elem == "records":
                raise ValueError(f"{where}: arrays of records are not supported")
            if not f.nullable.empty and (f.is_fixed or f.elem == "uuid") and not f.is_array:
                raise ValueError(f"{where}: {f.type} cannot be nullable")


def load_specs(sources: dict[str, str]) -> list[MessageSpec]:
    specs = [parse_message(name, sources[name]) for name in sorted(sources)]
    modules = [s.module for s in specs]
    if len(set(modules)) != len(modules):
        raise ValueError("two message files map to the same module name")
    return specs


# ---------------------------------------------------------------------------------------------
# Values: defaults, annotations


def parse_int_default(text: str) -> int:
    """Schema int defaults are decimal, ``0x`` hex or ``0``-prefixed octal (Java's rules)."""
    t = text.strip()
    neg = t.startswith("-")
    body = t[1:] if neg else t
    if body.lower().startswith("0x"):
        value = int(body, 16)
    elif len(body) > 1 and body.startswith("0"):
        value = int(body, 8)
    else:
        value = int(body)
    return -value if neg else value


def py_str(s: str) -> str:
    """A double-quoted Python literal (what ruff format would produce)."""
    r = repr(s)
    if r.startswith("'") and '"' not in s:
        r = '"' + r[1:-1].replace("\\'", "'") + '"'
    return r


def default_expr(f: FieldSpec) -> str:
    """Python expression for the field's default value (a fresh object for lists/structs)."""
    d = f.default
    if d == "null":
        if f.nullable.empty:
            raise ValueError(f"{f.name}: null default on a non-nullable field")
        return "None"
    if f.is_array:
        if d not in (None, ""):
            raise ValueError(f"{f.name}: arrays only take a null default")
        return "[]"
    if f.struct is not None:
        if d not in (None, ""):
            raise ValueError(f"{f.name}: structs only take a null default")
        return f"{f.struct.name}()"
    t = f.type
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return str(parse_int_default(str(d))) if d not in (None, "") else "0"
    if t == "float64":
        return repr(float(str(d))) if d not in (None, "") else "0.0"
    if t == "bool":
        return "True" if str(d).lower() == "true" else "False"
    if t == "string":
        return py_str(str(d)) if d is not None else '""'
    if t == "bytes":
        return 'b""'
    if t == "records":
        return "None"
    if t == "uuid":
        if d not in (None, ""):
            raise ValueError(f"{f.name}: uuid defaults are not supported")
        return "_ZERO_UUID"
    raise ValueError(f"{f.name}: no default for type {t}")


def is_mutable_default(f: FieldSpec) -> bool:
    return (f.is_array or f.struct is not None) and default_expr(f) != "None"


def not_default_test(f: FieldSpec, value: str) -> str:
    """A condition true when ``value`` differs from the field's default."""
    d = default_expr(f)
    if d == "None":
        return f"{value} is not None"
    if f.type == "bool":
        return f"not {value}" if d == "True" else value
    if f.struct is not None and not f.is_array:
        # A shared, never mutated default instance: cheaper than building one per test.
        return f"{value} != {default_struct_name(f.struct)}"
    return f"{value} != {d}"


def default_struct_name(s: StructSpec) -> str:
    return f"_DEFAULT_{s.name}"


def annotation(f: FieldSpec) -> str:
    elem = f.elem
    base = {
        "string": "str",
        "bytes": "bytes",
        "records": "bytes | memoryview",
        "uuid": "uuid.UUID",
        "float64": "float",
        "bool": "bool",
    }.get(elem, "int" if elem in FIXED_TYPES else elem)
    t = f"list[{base}]" if f.is_array else base
    return t + " | None" if not f.nullable.empty or default_expr(f) == "None" else t


# ---------------------------------------------------------------------------------------------
# Code writer


class Writer:
    """Lines of Python at an indentation level, with black/ruff-format style call wrapping."""

    def __init__(self, level: int = 0) -> None:
        self.lines: list[str] = []
        self.level = level

    def __call__(self, text: str = "") -> None:
        self.lines.append(INDENT * self.level + text if text else "")

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        self(header)
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    @contextmanager
    def indented(self) -> Iterator[None]:
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def child(self) -> Writer:
        return Writer(self.level + 1)

    def extend(self, other: Writer) -> None:
        self.lines.extend(other.lines)

    def wrapped(self, head: str, items: list[str], tail: str, collection: bool = False) -> None:
        """``head`` + comma-joined ``items`` + ``tail``, laid out as ruff format would: on one
        line if it fits; else (calls and signatures only) the items on one indented line; else
        one item per line with a trailing comma, which ruff then keeps as it is."""
        pad = INDENT * self.level
        one = f"{pad}{head}{', '.join(items)}{tail}"
        if len(one) <= LINE_LENGTH:
            self.lines.append(one)
            return
        self.lines.append(f"{pad}{head}")
        inner = f"{pad}{INDENT}{', '.join(items)}"
        if len(inner) <= LINE_LENGTH and not collection:
            self.lines.append(inner)
        else:
            self.lines.extend(f"{pad}{INDENT}{item}," for item in items)
        self.lines.append(f"{pad}{tail}")


# ---------------------------------------------------------------------------------------------
# Version layouts: what a field looks like on the wire in each version of a struct's context.


@dataclass(frozen=True)
class Layout:
    """How a field is on the wire in one version: absent, in the tagged section, or a regular
    field (compact or not, nullable or not)."""

    kind: str  # "absent", "tagged" or "regular"
    flexible: bool = False
    nullable: bool = False


ABSENT = Layout("absent")
TAGGED = Layout("tagged")
T = TypeVar("T")


@dataclass(frozen=True)
class Run(Generic[T]):
    """Versions ``lo..hi`` that share ``value``."""

    lo: int
    hi: int
    value: T


def layout(f: FieldSpec, version: int, msg_flexible: Versions) -> Layout:
    if version not in f.versions:
        return ABSENT
    if version in f.tagged:
        return TAGGED
    if f.is_fixed:  # compactness and nullability do not apply
        return Layout("regular")
    flexible = f.flexible_override if f.flexible_override is not None else msg_flexible
    return Layout("regular", version in flexible, version in f.nullable)


def runs_of(ctx: Versions, fn: Callable[[int], T]) -> list[Run[T]]:
    """Split ``ctx`` into maximal runs of consecutive versions where ``fn`` is constant."""
    runs: list[Run[T]] = []
    for v in ctx:
        value = fn(v)
        if runs and runs[-1].value == value:
            runs[-1] = Run(runs[-1].lo, v, value)
        else:
            runs.append(Run(v, v, value))
    return runs


def range_test(lo: int, hi: int, ctx: Versions, covered_from_lo: bool = False) -> str | None:
    """Condition selecting versions ``lo..hi`` within ``ctx`` (None = always true).
    ``covered_from_lo``: earlier branches of the same if/elif chain took every version below
    ``lo``, so only the upper bound needs testing."""
    need_lo = lo > ctx.lo and not covered_from_lo
    need_hi = hi < ctx.hi
    if need_hi and not need_lo and hi == ctx.lo:
        return f"version == {hi}"
    if need_lo and need_hi:
        return f"version == {lo}" if lo == hi else f"{lo} <= version <= {hi}"
    if need_lo:
        return f"version >= {lo}"
    if need_hi:
        return f"version <= {hi}"
    return None


def emit_chain(
    w: Writer, ctx: Versions, runs: list[Run[T]], emit: Callable[[Writer, T], None]
) -> None:
    """An if/elif/else over version ``runs`` (which partition ``ctx``), each branch written by
    ``emit``; branches that generate no code are left out."""
    if len(runs) == 1:  # the same in every version: no test at all
        emit(w, runs[0].value)
        return
    bodies: list[tuple[Run[T], Writer]] = []
    for run in runs:
        body = w.child()
        emit(body, run.value)
        if body.lines:
            bodies.append((run, body))
    complete = len(bodies) == len(runs)
    covered_to = ctx.lo - 1  # versions ctx.lo..covered_to are taken by earlier branches
    for i, (run, body) in enumerate(bodies):
        contiguous = covered_to == run.lo - 1
        if i == len(bodies) - 1 and complete and i > 0:
            w("else:")
        else:
            test = range_test(run.lo, run.hi, ctx, covered_from_lo=contiguous and i > 0)
            w(f"{'if' if i == 0 else 'elif'} {test or 'True'}:")
        w.extend(body)
        if contiguous:
            covered_to = run.hi


# ---------------------------------------------------------------------------------------------
# Module generation


class ModuleGen:
    """Generates one message module."""

    def __init__(self, spec: MessageSpec, kafka_version: str) -> None:
        self.spec = spec
        self.kafka_version = kafka_version
        self.helpers: set[str] = {"_Message", "_run_encoder", "_run_decoder"}
        self.formats: dict[str, str] = {}  # struct format -> constant name
        self.uses_uuid_annotation = False

    # -- helpers -------------------------------------------------------------------------------

    def h(self, name: str) -> str:
        """Name of a ``kcore.protocol.types`` helper, imported with a leading underscore."""
        self.helpers.add("_" + name)
        return "_" + name

    def struct_const(self, codes: str) -> str:
        if codes not in self.formats:
            self.formats[codes] = "_S_" + "_".join(FORMAT_NAMES[c] for c in codes)
        return self.formats[codes]

    def flexible_in(self, s: StructSpec) -> Versions:
        return self.spec.flexible & s.context

    # -- whole module --------------------------------------------------------------------------

    def generate(self) -> str:
        spec = self.spec
        body = Writer()
        for s in spec.structs:
            self.emit_class(body, s)
            body()
            body()
        # Struct fields' default instances, for the encoders' "is it the default?" tests.
        defaults = {
            f.struct.name: default_struct_name(f.struct)
            for s in spec.structs
            for f in s.fields
            if f.struct is not None and not f.is_array and default_expr(f) != "None"
        }
        for name, const in sorted(defaults.items()):
            body(f"{const} = {name}()  # compared against, never handed out")
        if defaults:
            body()
            body()
        for s in spec.structs:
            self.emit_encoder(body, s)
            body()
            body()
            self.emit_decoder(body, s)
            body()
            body()
        while body.lines and not body.lines[-1]:
            body.lines.pop()
        head = Writer()
        self.emit_header(head)
        return "\n".join(head.lines + body.lines) + "\n"

    def emit_header(self, w: Writer) -> None:
        spec = self.spec
        what = f"{spec.name}"
        if spec.api_key is not None:
            what += f" (API key {spec.api_key})"
        w('"""' + f"{what}: versions {spec.valid}, flexible versions {spec.flexible}.")
        w()
        w(f"Generated by tools/generate_protocol.py from {spec.source} in Apache Kafka")
        w(f"{self.kafka_version}. Do not edit; regenerate instead.")
        w('"""')
        w()
        w("from __future__ import annotations")
        w()
        stdlib = ["import uuid"] if self.uses_uuid_annotation else []
        if self.formats:
            stdlib.append("from struct import Struct as _Struct")
        for line in stdlib:
            w(line)
        if stdlib:
            w()
        imports = sorted((name[1:], name) for name in self.helpers if name not in ("_new",))
        items = [f"{src} as {alias}" for src, alias in imports]
        w.wrapped("from kcore.protocol.types import (", items, ")", collection=True)
        w()
        w("_new = object.__new__")
        for codes, const in sorted(self.formats.items(), key=lambda kv: kv[1]):
            w(f'{const} = _Struct(">{codes}")')
        w()
        w()

    # -- classes -------------------------------------------------------------------------------

    def emit_class(self, w: Writer, s: StructSpec) -> None:
        spec = self.spec
        with w.block(f"class {s.name}(_Message):"):
            self.emit_docstring(w, s)
            w()
            slots = [py_str(f.attr) for f in s.fields] + ['"_unknown_tagged_fields"']
            if len(slots) == 1:
                w(f"__slots__ = ({slots[0]},)")
            else:
                w.wrapped("__slots__ = (", slots, ")", collection=True)
            w()
            if s.is_root and spec.api_key is not None:
                w(f"API_KEY = {spec.api_key}")
            w(f"NAME = {py_str(s.name)}")
            w(f"VALID_VERSIONS = {s.context.as_tuple()!r}")
            flex = self.flexible_in(s)
            w(f"FLEXIBLE_VERSIONS = {flex.lo if not flex.empty else None!r}")
            self.emit_fields_info(w, s)
            if s.is_root:
                for other in spec.structs:
                    if other is not s:
                        w(f"{other.name} = {other.name}")
            w()
            self.emit_init(w, s)
            w()
            self.emit_eq(w, s)
            w()
            with w.block("def encode_into(self, out: bytearray, version: int) -> None:"):
                w('"""Append this object\'s encoding at ``version`` to ``out``."""')
                w.wrapped("_run_encoder(", ["self", f"_encode_{s.name}", "out", "version"], ")")
            w()
            w("@classmethod")
            w.wrapped(
                "def decode(",
                ["cls", "buf: bytes | bytearray | memoryview", "version: int", "pos: int = 0"],
                f") -> tuple[{s.name}, int]:",
            )
            with w.indented():
                w('"""Decode one object at ``buf[pos:]``; return it and the position after it."""')
                w.wrapped(
                    "return _run_decoder(",
                    ["cls", f"_decode_{s.name}", "buf", "version", "pos"],
                    ")",
                )

    def emit_eq(self, w: Writer, s: StructSpec) -> None:
        """Field-by-field ``__eq__`` (the base class's generic one is several times slower,
        and encoders compare struct fields against their defaults)."""
        with w.block("def __eq__(self, other: object) -> bool:"):
            with w.block("if type(other) is not type(self):"):
                w("return NotImplemented")
            attrs = [f.attr for f in s.fields] + ["_unknown_tagged_fields"]
            tests = [f"self.{a} == other.{a}" for a in attrs]
            one = f"return {' and '.join(tests)}"
            if len(INDENT * w.level + one) <= LINE_LENGTH:
                w(one)
                return
            with w.block("return ("):
                inner = " and ".join(tests)
                if len(INDENT * w.level + inner) <= LINE_LENGTH:
                    w(inner)
                else:
                    for i, a in enumerate(attrs):
                        test = ("and " if i else "") + f"self.{a} == other.{a}"
                        if len(INDENT * w.level + test) <= LINE_LENGTH:
                            w(test)
                        else:  # too long even alone: ruff breaks before the operator
                            w(("and " if i else "") + f"self.{a}")
                            w(f"== other.{a}")
            w(")")

    def emit_fields_info(self, w: Writer, s: StructSpec) -> None:
        """``FIELDS``: the schema facts of each field, for introspection and tests."""
        infos = [
            [
                py_str(f.attr),
                py_str(f.name),
                py_str(f.type),
                repr(f.versions.as_tuple()),
                repr(f.nullable.as_tuple()),
                repr(f.tagged.as_tuple()),
                repr(f.tag),
                repr(f.ignorable),
            ]
            for f in s.fields
        ]
        if not infos:
            w("FIELDS = ()")
            return
        self.h("FieldInfo")
        one = f"FIELDS = (_FieldInfo({', '.join(infos[0])}),)"
        if len(infos) == 1 and len(INDENT * w.level + one) <= LINE_LENGTH:
            w(one)  # a one-tuple's comma is not a "magic" trailing comma: keep it on one line
            return
        with w.block("FIELDS = ("):
            for args in infos:
                w.wrapped("_FieldInfo(", args, "),")
        w(")")

    def emit_docstring(self, w: Writer, s: StructSpec) -> None:
        spec = self.spec
        if s.is_root:
            kind = {
                "request": "Request",
                "response": "Response",
                "header": "Header",
                "data": "Data",
                "metadata": "Metadata record",
            }.get(spec.kind, spec.kind)
            first = f"{kind} ``{s.name}``"
            if spec.api_key is not None:
                first += f" (API key {spec.api_key})"
            first += f", versions {spec.valid}."
        else:
            first = s.about or f"``{s.name}``."
        lines = [first]
        if s.fields:
            lines += ["", "Fields:"]
            for f in s.fields:
                facts = [f"``{f.type}``", f"versions {f.versions}"]
                if not f.nullable.empty:
                    facts.append(f"nullable {f.nullable}")
                if f.tag is not None:
                    facts.append(f"tag {f.tag} in {f.tagged}")
                if f.ignorable:
                    facts.append("ignorable")
                text = f"{f.attr} ({', '.join(facts)}): {f.about}".rstrip()
                lines += textwrap.wrap(
                    text,
                    LINE_LENGTH - len(INDENT) * (w.level + 1),
                    initial_indent=INDENT,
                    subsequent_indent=INDENT * 2,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
        text = "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        doc = text.split("\n")
        if len(doc) == 1 and len(INDENT * w.level + doc[0]) + 6 <= LINE_LENGTH:
            w(f'"""{doc[0]}"""')
            return
        w(f'"""{doc[0]}')
        for line in doc[1:]:
            w(line)
        w('"""')

    def emit_init(self, w: Writer, s: StructSpec) -> None:
        params = ["self", "*"] if s.fields else ["self"]
        for f in s.fields:
            ann = annotation(f)
            if "uuid." in ann:
                self.uses_uuid_annotation = True
            if is_mutable_default(f):
                default = self.h("MISSING")
            else:
                default = self.default(f)
            params.append(f"{f.attr}: {ann} = {default}")
        w.wrapped("def __init__(", params, ") -> None:")
        with w.indented():
            self.emit_init_body(w, s)

    def emit_init_body(self, w: Writer, s: StructSpec) -> None:
        for f in s.fields:
            if is_mutable_default(f):
                value = f"{self.default(f)} if {f.attr} is _MISSING else {f.attr}"
                if len(INDENT * w.level + f"self.{f.attr} = {value}") <= LINE_LENGTH:
                    w(f"self.{f.attr} = {value}")
                else:
                    with w.block(f"self.{f.attr} = ("):
                        w(value)
                    w(")")
            else:
                w(f"self.{f.attr} = {f.attr}")
        w("self._unknown_tagged_fields: list[tuple[int, bytes]] | None = None")

    def default(self, f: FieldSpec) -> str:
        d = default_expr(f)
        if d == "_ZERO_UUID":
            self.h("ZERO_UUID")
        return d

    # -- layout planning -----------------------------------------------------------------------

    def plan(self, s: StructSpec) -> list[list[FieldSpec]]:
        """Fields in wire order, each run of adjacent fixed-width (never tagged) fields merged
        into a group: in every version the group's present fields are read or written with
        one ``struct.Struct`` call."""
        groups: list[list[FieldSpec]] = []
        prev_fixed = False
        for f in s.fields:
            fixed = f.is_fixed and f.tagged.empty
            if fixed and prev_fixed:
                groups[-1].append(f)
            else:
                groups.append([f])
            prev_fixed = fixed
        return groups

    def is_group(self, group: list[FieldSpec]) -> bool:
        return len(group) > 1 or (group[0].is_fixed and group[0].tagged.empty)

    def group_runs(self, s: StructSpec, group: list[FieldSpec]) -> list[Run[tuple[FieldSpec, ...]]]:
        """Version runs over which the same fields of ``group`` are present."""
        return runs_of(s.context, lambda v: tuple(f for f in group if v in f.versions))

    def layout_runs(self, s: StructSpec, f: FieldSpec) -> list[Run[Layout]]:
        return runs_of(s.context, lambda v: layout(f, v, self.spec.flexible))

    def tagged_fields(self, s: StructSpec) -> list[tuple[int, FieldSpec]]:
        """``(tag, field)`` for the fields tagged in some version of ``s``, in tag order."""
        found = [
            (f.tag, f) for f in s.fields if f.tag is not None and not (f.tagged & s.context).empty
        ]
        return sorted(found, key=lambda item: item[0])

    # -- encoders ------------------------------------------------------------------------------

    def emit_encoder(self, w: Writer, s: StructSpec) -> None:
        w.wrapped(
            f"def _encode_{s.name}(",
            [f"o: {s.name}", "out: bytearray", "version: int"],
            ") -> None:",
        )
        with w.indented():
            start = len(w.lines)
            for group in self.plan(s):
                if self.is_group(group):
                    self.emit_encode_group(w, s, group)
                else:
                    self.emit_encode_field(w, s, group[0])
            self.emit_encode_tags(w, s)
            if len(w.lines) == start:
                w("pass")

    def emit_encode_group(self, w: Writer, s: StructSpec, group: list[FieldSpec]) -> None:
        def emit(body: Writer, fields: tuple[FieldSpec, ...]) -> None:
            for f in group:
                if f not in fields:
                    self.emit_absent_check(body, s, f)
            if fields:
                const = self.struct_const("".join(FIXED_TYPES[f.type][0] for f in fields))
                body.wrapped(f"out += {const}.pack(", [f"o.{f.attr}" for f in fields], ")")

        emit_chain(w, s.context, self.group_runs(s, group), emit)

    def emit_encode_field(self, w: Writer, s: StructSpec, f: FieldSpec) -> None:
        def emit(body: Writer, lay: Layout) -> None:
            if lay == ABSENT:
                self.emit_absent_check(body, s, f)
            elif lay != TAGGED:  # tagged: written in the tagged section at the end
                self.emit_write(body, s, f, f"o.{f.attr}", "out", lay)

        emit_chain(w, s.context, self.layout_runs(s, f), emit)

    def emit_absent_check(self, w: Writer, s: StructSpec, f: FieldSpec) -> None:
        """Java's rule: a non-default value in a field the version lacks is an error unless the
        field is ignorable (then it is silently dropped)."""
        if f.ignorable:
            return
        with w.block(f"if {not_default_test(f, 'o.' + f.attr)}:"):
            w.wrapped(
                f"raise {self.h('field_not_in_version')}(",
                [py_str(s.name), py_str(f.attr), "version"],
                ")",
            )

    def emit_write(
        self,
        w: Writer,
        s: StructSpec,
        f: FieldSpec,
        value: str,
        out: str,
        lay: Layout,
    ) -> None:
        """Code writing ``value`` (field ``f``, laid out as ``lay``) to bytearray ``out``."""
        elem = f.elem
        flexible, nullable = lay.flexible, lay.nullable
        if f.is_array:
            self.emit_write_array(w, s, f, value, out, flexible, nullable)
        elif f.struct is not None:
            if nullable:
                # KIP-893: a nullable struct is preceded by a presence byte: int8 -1/1 in a
                # regular field, 0/1 in a tagged field.
                w(f"v = {value}")
                with w.block("if v is None:"):
                    w(f"{out}.append({0 if lay == TAGGED else 0xFF})")
                with w.block("else:"):
                    w(f"{out}.append(1)")
                    w(f"_encode_{f.struct.name}(v, {out}, version)")
            else:
                w(f"_encode_{f.struct.name}({value}, {out}, version)")
        elif f.is_fixed:
            codes = FIXED_TYPES[f.type][0]
            w(f"{out} += {self.struct_const(codes)}.pack({value})")
        elif elem == "uuid":
            w(f"{out} += {value}.bytes")
        elif elem in ("string", "bytes", "records"):
            name = ("compact_" if flexible else "") + ("nullable_" if nullable else "") + elem
            w(f"{self.h('write_' + name)}({out}, {value})")
        else:
            raise ValueError(f"cannot encode {f.type}")

    def emit_write_array(
        self,
        w: Writer,
        s: StructSpec,
        f: FieldSpec,
        value: str,
        out: str,
        flexible: bool,
        nullable: bool,
    ) -> None:
        w(f"a = {value}")
        with w.block("if a is None:"):
            if nullable:
                w(f"{out}.append(0)" if flexible else f'{out} += b"\\xff\\xff\\xff\\xff"')
            else:
                w(f"raise {self.h('null_not_allowed')}({py_str(s.name + '.' + f.attr)})")
        with w.block("else:"):
            if flexible:
                w(f"{self.h('write_compact_length')}({out}, len(a))")
            else:
                w(f"{self.h('write_length')}({out}, len(a))")
            elem = f.elem
            if f.struct is not None:
                with w.block("for e in a:"):
                    w(f"_encode_{f.struct.name}(e, {out}, version)")
            elif elem in FIXED_TYPES:
                w(f"{self.h('write_fixed_array')}({out}, a, {py_str(FIXED_TYPES[elem][0])})")
            elif elem == "uuid":
                with w.block("for e in a:"):
                    w(f"{out} += e.bytes")
            elif elem in ("string", "bytes"):
                name = ("compact_" if flexible else "") + elem
                writer = self.h("write_" + name)
                with w.block("for e in a:"):
                    w(f"{writer}({out}, e)")
            else:
                raise ValueError(f"cannot encode {f.type}")

    def emit_encode_tags(self, w: Writer, s: StructSpec) -> None:
        flex = self.flexible_in(s)
        if flex.empty:
            return
        body = Writer(w.level)
        tagged = self.tagged_fields(s)
        test = range_test(flex.lo, flex.hi, s.context)
        if test:
            w(f"if {test}:")
            body.level += 1
        if not tagged:
            body("u = o._unknown_tagged_fields")
            with body.block("if u:"):
                body(f"{self.h('write_tags')}(out, [], u)")
            with body.block("else:"):
                body("out.append(0)")
        else:
            body("tags: list[tuple[int, bytearray]] = []")
            for tag, f in tagged:
                # Only a value that differs from the default is written (Java does the same).
                tctx = f.tagged & s.context
                cond = [c for c in (range_test(tctx.lo, tctx.hi, flex),) if c]
                cond.append(not_default_test(f, f"o.{f.attr}"))
                with body.block(f"if {' and '.join(cond)}:"):
                    body("t = bytearray()")
                    self.emit_tagged_value(body, s, f, tctx, write=True)
                    body(f"tags.append(({tag}, t))")
            body(f"{self.h('write_tags')}(out, tags, o._unknown_tagged_fields)")
        w.extend(body)

    def emit_tagged_value(
        self, w: Writer, s: StructSpec, f: FieldSpec, tctx: Versions, write: bool
    ) -> None:
        """Write ``o.<field>`` into ``t``, or read it from ``buf``, as a tagged field: always
        compact, nullable in the versions the field says."""

        def emit(b: Writer, nullable: bool) -> None:
            lay = Layout("tagged", flexible=True, nullable=nullable)
            if write:
                self.emit_write(b, s, f, f"o.{f.attr}", "t", lay)
            else:
                self.emit_read(b, s, f, f"o.{f.attr}", lay)

        emit_chain(w, tctx, runs_of(tctx, lambda v: v in f.nullable), emit)

    # -- decoders ------------------------------------------------------------------------------

    def emit_decoder(self, w: Writer, s: StructSpec) -> None:
        w.wrapped(
            f"def _decode_{s.name}(",
            ["buf", "pos: int", "version: int"],
            f") -> tuple[{s.name}, int]:",
        )
        with w.indented():
            w(f"o = _new({s.name})")
            for group in self.plan(s):
                if self.is_group(group):
                    self.emit_decode_group(w, s, group)
                else:
                    self.emit_decode_field(w, s, group[0])
            self.emit_decode_tags(w, s)
            w("return o, pos")

    def emit_decode_group(self, w: Writer, s: StructSpec, group: list[FieldSpec]) -> None:
        def emit(body: Writer, fields: tuple[FieldSpec, ...]) -> None:
            if fields:
                const = self.struct_const("".join(FIXED_TYPES[f.type][0] for f in fields))
                targets = [f"o.{f.attr}" for f in fields]
                line = f"{', '.join(targets)} = {const}.unpack_from(buf, pos)"
                if len(fields) == 1:
                    line = f"({targets[0]},) = {const}.unpack_from(buf, pos)"
                if len(INDENT * body.level + line) > LINE_LENGTH:
                    body.wrapped(
                        "(", targets, f") = {const}.unpack_from(buf, pos)", collection=True
                    )
                else:
                    body(line)
                body(f"pos += {sum(FIXED_TYPES[f.type][1] for f in fields)}")
            for f in group:
                if f not in fields:
                    body(f"o.{f.attr} = {self.default(f)}")

        emit_chain(w, s.context, self.group_runs(s, group), emit)

    def emit_decode_field(self, w: Writer, s: StructSpec, f: FieldSpec) -> None:
        def emit(body: Writer, lay: Layout) -> None:
            if lay == ABSENT:
                body(f"o.{f.attr} = {self.default(f)}")
            else:
                self.emit_read(body, s, f, f"o.{f.attr}", lay)

        # A tagged field starts out at its default (the tagged section may then set it), like
        # an absent one: one branch for both.
        def lay_out(v: int) -> Layout:
            lay = layout(f, v, self.spec.flexible)
            return ABSENT if lay == TAGGED else lay

        emit_chain(w, s.context, runs_of(s.context, lay_out), emit)

    def emit_read(
        self,
        w: Writer,
        s: StructSpec,
        f: FieldSpec,
        target: str,
        lay: Layout,
    ) -> None:
        """Code reading field ``f`` (laid out as ``lay``) at ``pos`` into ``target`` and
        advancing ``pos``."""
        elem = f.elem
        flexible, nullable = lay.flexible, lay.nullable
        if f.is_array:
            self.emit_read_array(w, s, f, target, flexible, nullable)
        elif f.struct is not None:
            if nullable:
                null = "== 0" if lay == TAGGED else ">= 0x80"  # presence byte, see emit_write
                with w.block(f"if buf[pos] {null}:"):
                    w("pos += 1")
                    w(f"{target} = None")
                with w.block("else:"):
                    w(f"{target}, pos = _decode_{f.struct.name}(buf, pos + 1, version)")
            else:
                w(f"{target}, pos = _decode_{f.struct.name}(buf, pos, version)")
        elif f.is_fixed:
            code, size = FIXED_TYPES[f.type]
            w(f"({target},) = {self.struct_const(code)}.unpack_from(buf, pos)")
            w(f"pos += {size}")
        elif elem == "uuid":
            w(f"{target}, pos = {self.h('read_uuid')}(buf, pos)")
        elif elem in ("string", "bytes"):
            name = ("compact_" if flexible else "") + ("nullable_" if nullable else "") + elem
            w(f"{target}, pos = {self.h('read_' + name)}(buf, pos)")
        elif elem == "records":
            name = "compact_records" if flexible else "records"
            w(f"{target}, pos = {self.h('read_' + name)}(buf, pos)")
            if not nullable:
                with w.block(f"if {target} is None:"):
                    what = py_str(f"null in non-nullable {s.name}.{f.attr}")
                    w.wrapped(f"raise {self.h('InvalidLengthError')}(", [what, "pos"], ")")
        else:
            raise ValueError(f"cannot decode {f.type}")

    def emit_read_array(
        self, w: Writer, s: StructSpec, f: FieldSpec, target: str, flexible: bool, nullable: bool
    ) -> None:
        if flexible:
            # Inline the one-byte case of the compact length; most arrays are short.
            w("n = buf[pos]")
            with w.block("if n < 0x80:"):
                w("pos += 1")
            with w.block("else:"):
                w(f"n, pos = {self.h('decode_uvarint')}(buf, pos)")
            w("n -= 1")
        else:
            w(f"(n,) = {self.struct_const('i')}.unpack_from(buf, pos)")
            w("pos += 4")
        with w.block("if n < 0:"):
            if nullable:
                w(f"{target} = None")
            else:
                what = py_str(f"null in non-nullable {s.name}.{f.attr}")
                w.wrapped(f"raise {self.h('InvalidLengthError')}(", [what, "pos"], ")")
        with w.block("else:"):
            elem = f.elem
            if f.struct is not None:
                # Like the Java client: a count above the bytes left is corrupt (and must not
                # make us loop billions of times).
                with w.block("if n > len(buf) - pos:"):
                    w(f"raise {self.h('array_too_long')}(n, pos)")
                w("items = []")
                with w.block("for _ in range(n):"):
                    w(f"item, pos = _decode_{f.struct.name}(buf, pos, version)")
                    w("items.append(item)")
                w(f"{target} = items")
            elif elem in FIXED_TYPES:
                code, size = FIXED_TYPES[elem]
                reader = self.h("read_fixed_array")
                w(f"{target}, pos = {reader}(buf, pos, n, {py_str(code)}, {size})")
            elif elem in ("string", "bytes", "uuid"):
                name = "uuid" if elem == "uuid" else ("compact_" if flexible else "") + elem
                elem_reader = self.h("read_" + name)
                w(f"{self.h('check_array_length')}(buf, pos, n)")
                w(f"{target}, pos = {self.h('read_object_array')}(buf, pos, n, {elem_reader})")
            else:
                raise ValueError(f"cannot decode {f.type}")

    def emit_decode_tags(self, w: Writer, s: StructSpec) -> None:
        flex = self.flexible_in(s)
        if flex.empty:
            w("o._unknown_tagged_fields = None")
            return
        test = range_test(flex.lo, flex.hi, s.context)
        body = Writer(w.level + (1 if test else 0))
        tagged = self.tagged_fields(s)
        # Fast path: an empty tagged section is a single zero byte.
        with body.block("if buf[pos] == 0:"):
            body("pos += 1")
            body("o._unknown_tagged_fields = None")
        with body.block("else:"):
            if not tagged:
                body(f"o._unknown_tagged_fields, pos = {self.h('read_unknown_tags')}(buf, pos)")
            else:
                self.emit_tag_loop(body, s, flex, tagged)
        if test:
            w(f"if {test}:")
            w.extend(body)
            with w.block("else:"):
                w("o._unknown_tagged_fields = None")
        else:
            w.extend(body)

    def emit_tag_loop(
        self, w: Writer, s: StructSpec, flex: Versions, tagged: list[tuple[int, FieldSpec]]
    ) -> None:
        uvarint = self.h("decode_uvarint")
        w("unknown = None")
        w(f"count, pos = {uvarint}(buf, pos)")
        with w.block("for _ in range(count):"):
            w(f"tag, pos = {uvarint}(buf, pos)")
            w(f"size, pos = {uvarint}(buf, pos)")
            w("end = pos + size")
            for i, (tag, f) in enumerate(tagged):
                tctx = f.tagged & s.context
                cond = [f"tag == {tag}"]
                vt = range_test(tctx.lo, tctx.hi, flex)
                if vt:
                    cond.append(vt)
                with w.block(f"{'if' if i == 0 else 'elif'} {' and '.join(cond)}:"):
                    self.emit_tagged_value(w, s, f, tctx, write=False)
            with w.block("else:"):
                w(f"unknown = {self.h('add_unknown_tag')}(unknown, tag, buf, pos, end)")
                w("pos = end")
                w("continue")
            with w.block("if pos != end:"):
                args = [py_str(s.name), "tag", "size", "size + pos - end"]
                w.wrapped(f"raise {self.h('tag_size_mismatch')}(", args, ")")
        w("o._unknown_tagged_fields = unknown")


# ---------------------------------------------------------------------------------------------
# Compiled decoders (kcore/protocol/_decoders.pyx) for the hot responses


# Responses decoded often or in bulk, whose decoders are also generated as Cython. The Python
# classes stay the reference: the compiled decoders build instances of them, field for field.
COMPILED_DECODERS = ("MetadataResponse", "ProduceResponse")
COMPILED_OUT = REPO / "src" / "kcore" / "protocol"
COMPILED_MODULE = "_decoders"

# Fixed-width type -> the runtime's reader of one value (src/kcore/protocol/_decode_runtime.pxi).
FIXED_READERS = {t: "fixed_" + t for t in FIXED_TYPES}

# Arrays of these structs decode to a StructArray (_decode_runtime.pxi): every element is read
# and checked at once, its objects made only when first asked for, and compiled code can read
# an element's fields as C values (its "raw" struct, declared in _decoders.pxd) without them. A
# 100,000-partition Metadata answer is 400,000 objects otherwise. Only structs of integers and
# arrays of integers qualify (their raw struct holds int64_t values and (start, count) pairs).
LAZY_STRUCTS = ("MetadataResponsePartition",)
RAW_INT_TYPES = {"int8", "int16", "uint16", "int32", "uint32", "int64"}
RAW_READERS = {t: "c_" + t for t in RAW_INT_TYPES}
RAW_SCRATCH = 512  # bytes _decoders.pxd reserves for any raw struct (16 a field at most)


class CompiledDecoderGen(ModuleGen):
    """The decoders of one message as Cython, branch for branch the Python decoder's (the same
    version runs, the same field groups, the same checks in the same order), so that both read
    the same bytes to equal objects and refuse bad bytes with the same kcore error. Values are
    stored straight into the generated classes' ``__slots__``."""

    def __init__(self, spec: MessageSpec, kafka_version: str) -> None:
        super().__init__(spec, kafka_version)
        self.prefix = f"{spec.module}_"

    def cls(self, s: StructSpec) -> str:
        return f"_C_{self.prefix}{s.name}"

    def fn(self, s: StructSpec) -> str:
        return f"_d_{self.prefix}{s.name}"

    def off(self, s: StructSpec, attr: str) -> str:
        return f"_O_{self.prefix}{s.name}_{attr.lstrip('_')}"

    def entry(self) -> str:
        return f"decode_{self.spec.module}"

    def default(self, f: FieldSpec) -> str:
        d = default_expr(f)
        if f.struct is not None and not f.is_array and d != "None":
            return f"{self.cls(f.struct)}()"
        return d

    def set(self, w: Writer, s: StructSpec, f: FieldSpec | str, value: str) -> None:
        attr = f if isinstance(f, str) else f.attr
        w(f"set_slot(o, {self.off(s, attr)}, {value})")

    # -- module parts --------------------------------------------------------------------------

    def emit_globals(self, w: Writer) -> None:
        spec = self.spec
        for s in spec.structs:
            w(f"cdef type {self.cls(s)} = _messages.{spec.module}.{s.name}")
        for s in spec.structs:
            for attr in [f.attr for f in s.fields] + ["_unknown_tagged_fields"]:
                w(f"cdef Py_ssize_t {self.off(s, attr)} = slot_offset(")
                w(f"{INDENT}{self.cls(s)}, {py_str(attr)}")
                w(")")

    # -- raw readers (LAZY_STRUCTS) ---------------------------------------------------------

    def lazy_structs(self) -> list[StructSpec]:
        found = [s for s in self.spec.structs if s.name in LAZY_STRUCTS]
        for s in found:
            for f in s.fields:
                ok = f.elem in RAW_INT_TYPES and f.tagged.empty and f.tag is None
                if f.is_array:
                    ok = ok and (f.nullable & s.context).empty and default_expr(f) == "[]"
                if not ok:
                    raise ValueError(f"{s.name}.{f.attr} ({f.type}) has no raw form")
            if 16 * len(s.fields) > RAW_SCRATCH:
                raise ValueError(f"{s.name} has too many fields for a raw struct")
        return found

    def raw_type(self, s: StructSpec) -> str:
        return f"{s.name}Raw"

    def raw_fn(self, s: StructSpec) -> str:
        return f"_r_{self.prefix}{s.name}"

    def emit_raw_struct(self, w: Writer, s: StructSpec) -> None:
        """The C struct (in _decoders.pxd) an element's raw reader fills: integers as int64_t,
        arrays of integers as where their big-endian values start in StructArray.data and how
        many there are."""
        w(f"ctypedef struct {self.raw_type(s)}:")
        with w.indented():
            for f in s.fields:
                if f.is_array:
                    w(f"Py_ssize_t {f.attr}_at  # {f.elem} values, big-endian")
                    w(f"Py_ssize_t {f.attr}_n")
                else:
                    w(f"int64_t {f.attr}")

    def emit_raw_reader(self, w: Writer, s: StructSpec) -> None:
        """The decoder of ``s`` with the same checks in the same order, storing C values into
        its raw struct instead of objects into an instance."""
        w(
            f"cdef int {self.raw_fn(s)}(Reader* r, Py_ssize_t* at, int version, void* dest) "
            "except -1:"
        )
        with w.indented():
            w(f"cdef {self.raw_type(s)}* out = <{self.raw_type(s)}*>dest")
            w("cdef Py_ssize_t pos = at[0]")
            w("cdef int64_t n")
            w("cdef const uint8_t* p")
            for group in self.plan(s):
                if self.is_group(group):
                    self.emit_raw_group(w, s, group)
                else:
                    self.emit_raw_field(w, s, group[0])
            flex = self.flexible_in(s)
            if not flex.empty:
                test = range_test(flex.lo, flex.hi, s.context)
                body = Writer(w.level + (1 if test else 0))
                body("need(r, pos, 1)")
                with body.block("if r.data[pos] == 0:"):
                    body("pos += 1")
                with body.block("else:"):
                    body("v, pos = _read_unknown_tags(<object>r.obj, pos)")
                if test:
                    w(f"if {test}:")
                w.extend(body)
            w("at[0] = pos")
            w("return 0")

    def emit_raw_group(self, w: Writer, s: StructSpec, group: list[FieldSpec]) -> None:
        def store(body: Writer, f: FieldSpec, value: str) -> None:
            body(f"out.{f.attr} = {value}")

        self.emit_group_reads(w, s, group, RAW_READERS, store, default_expr)

    def emit_raw_field(self, w: Writer, s: StructSpec, f: FieldSpec) -> None:
        assert f.is_array
        size = FIXED_TYPES[f.elem][1]

        def emit(body: Writer, lay: Layout) -> None:
            if lay == ABSENT:
                body(f"out.{f.attr}_at = 0")
                body(f"out.{f.attr}_n = 0")
                return
            flexible = lay.flexible
            body("n = read_uvarint(r, &pos) - 1" if flexible else "n = read_i32_length(r, &pos)")
            with body.block("if n < 0:"):
                body(f"null_in({py_str(f'null in non-nullable {s.name}.{f.attr}')}, pos)")
            body(f"out.{f.attr}_at = skip_fixed_array(r, &pos, n, {size})")
            body(f"out.{f.attr}_n = n")

        def lay_out(v: int) -> Layout:
            lay = layout(f, v, self.spec.flexible)
            return ABSENT if lay == TAGGED else lay

        emit_chain(w, s.context, runs_of(s.context, lay_out), emit)

    # -- decoders ------------------------------------------------------------------------------

    def emit_decoders(self, w: Writer) -> None:
        for s in self.lazy_structs():
            self.emit_raw_reader(w, s)
            w()
            w()
        for s in self.spec.structs:
            self.emit_decoder(w, s)
            w()
            w()
        root = self.spec.root
        name = self.spec.name
        w(
            f"def {self.entry()}(object buf, int version, Py_ssize_t pos=0, "
            "Py_ssize_t pause_every=0, object pause=None):"
        )
        with w.indented():
            w(f'"""``{name}.decode`` compiled: one object at ``buf[pos:]`` and the position')
            w("after it. ``pause_every``: on a worker thread, let other threads run after about")
            w("that many array elements (0: never), by calling ``pause`` if given (see")
            w('pause_point in _decode_runtime.pxi)."""')
            w("cdef Reader r")
            w("cdef Py_buffer view")
            w(f"_check_version({self.cls(root)}, version)")
            w("open_reader(&r, &view, buf, pos, pause_every, pause)")
            with w.block("try:"):
                w(f"o = {self.fn(root)}(&r, &pos, version)")
            with w.block("except UnicodeDecodeError as exc:"):
                msg = f'f"{name} v{{version}}: a string is not valid UTF-8"'
                w(f"raise ProtocolError({msg}) from exc")
            with w.block("except (_struct_module.error, IndexError) as exc:"):
                msg = f'f"{name} v{{version}}: input ends early ({{exc}})"'
                w(f"raise TruncatedDataError({msg}) from exc")
            with w.block("finally:"):
                w("PyBuffer_Release(&view)")
            w("return o, pos")

    def emit_decoder(self, w: Writer, s: StructSpec) -> None:
        w(f"cdef object {self.fn(s)}(Reader* r, Py_ssize_t* at, int version):")
        with w.indented():
            w("cdef Py_ssize_t pos = at[0]")
            w("cdef Py_ssize_t i")
            w("cdef int64_t n, count, tag, size, end")
            w("cdef const uint8_t* p")
            w("cdef list items")
            w(f"o = new_instance({self.cls(s)})")
            for group in self.plan(s):
                if self.is_group(group):
                    self.emit_decode_group(w, s, group)
                else:
                    self.emit_decode_field(w, s, group[0])
            self.emit_decode_tags(w, s)
            w("at[0] = pos")
            w("return o")

    def emit_decode_group(self, w: Writer, s: StructSpec, group: list[FieldSpec]) -> None:
        def store(body: Writer, f: FieldSpec, value: str) -> None:
            self.set(body, s, f, value)

        self.emit_group_reads(w, s, group, FIXED_READERS, store, self.default)

    def emit_group_reads(
        self,
        w: Writer,
        s: StructSpec,
        group: list[FieldSpec],
        readers: dict[str, str],
        store: Callable[[Writer, FieldSpec, str], None],
        default: Callable[[FieldSpec], str],
    ) -> None:
        """A run of fixed-width fields, read in each version with one bounds check; ``store``
        puts each value (read by ``readers[type]``, or the field's ``default``) where it goes."""

        def emit(body: Writer, fields: tuple[FieldSpec, ...]) -> None:
            if fields:
                total = sum(FIXED_TYPES[f.type][1] for f in fields)
                body(f"need(r, pos, {total})")
                body("p = r.data + pos")
                at = 0
                for f in fields:
                    where = "p" if at == 0 else f"p + {at}"
                    store(body, f, f"{readers[f.type]}({where})")
                    at += FIXED_TYPES[f.type][1]
                body(f"pos += {total}")
            for f in group:
                if f not in fields:
                    store(body, f, default(f))

        emit_chain(w, s.context, self.group_runs(s, group), emit)

    def emit_decode_field(self, w: Writer, s: StructSpec, f: FieldSpec) -> None:
        def emit(body: Writer, lay: Layout) -> None:
            if lay == ABSENT:
                self.set(body, s, f, self.default(f))
            else:
                self.emit_read(body, s, f, "", lay)

        def lay_out(v: int) -> Layout:
            lay = layout(f, v, self.spec.flexible)
            return ABSENT if lay == TAGGED else lay

        emit_chain(w, s.context, runs_of(s.context, lay_out), emit)

    def emit_read(self, w: Writer, s: StructSpec, f: FieldSpec, target: str, lay: Layout) -> None:
        """Read field ``f`` (laid out as ``lay``) at ``pos`` into its slot of ``o``."""
        elem = f.elem
        flexible, nullable = lay.flexible, lay.nullable
        if f.is_array:
            self.emit_read_array(w, s, f, "", flexible, nullable)
        elif f.struct is not None:
            if nullable:
                null = "== 0" if lay == TAGGED else ">= 0x80"  # the presence byte
                w("need(r, pos, 1)")
                with w.block(f"if r.data[pos] {null}:"):
                    w("pos += 1")
                    self.set(w, s, f, "None")
                with w.block("else:"):
                    w("pos += 1")
                    self.set(w, s, f, f"{self.fn(f.struct)}(r, &pos, version)")
            else:
                self.set(w, s, f, f"{self.fn(f.struct)}(r, &pos, version)")
        elif f.is_fixed:
            size = FIXED_TYPES[f.type][1]
            w(f"need(r, pos, {size})")
            self.set(w, s, f, f"{FIXED_READERS[f.type]}(r.data + pos)")
            w(f"pos += {size}")
        elif elem == "uuid":
            self.set(w, s, f, "read_uuid(r, &pos)")
        elif elem in ("string", "bytes"):
            reader = ("read_compact_" if flexible else "read_") + elem
            self.set(w, s, f, f"{reader}(r, &pos, {nullable})")
        elif elem == "records":
            name = "read_compact_records" if flexible else "read_records"
            w(f"v, pos = _types.{name}(<object>r.obj, pos)")
            if not nullable:
                with w.block("if v is None:"):
                    w(f"null_in({py_str(f'null in non-nullable {s.name}.{f.attr}')}, pos)")
            self.set(w, s, f, "v")
        else:
            raise ValueError(f"cannot decode {f.type}")

    def emit_read_array(
        self, w: Writer, s: StructSpec, f: FieldSpec, target: str, flexible: bool, nullable: bool
    ) -> None:
        w("n = read_uvarint(r, &pos) - 1" if flexible else "n = read_i32_length(r, &pos)")
        with w.block("if n < 0:"):
            if nullable:
                self.set(w, s, f, "None")
            else:
                w(f"null_in({py_str(f'null in non-nullable {s.name}.{f.attr}')}, pos)")
        with w.block("else:"):
            elem = f.elem
            if f.struct is not None or elem in ("string", "bytes", "uuid"):
                with w.block("if n > r.size - pos:"):
                    w("array_too_long(n, pos)")
                if f.struct is not None and f.struct.name in LAZY_STRUCTS:
                    e = f.struct
                    made = f"struct_array(r, &pos, n, version, {self.cls(e)}, {self.fn(e)}, "
                    self.set(w, s, f, made + f"{self.raw_fn(e)})")
                    return
                w("items = new_list(n)")
                with w.block("for i in range(n):"):
                    if f.struct is not None:
                        w(f"item = {self.fn(f.struct)}(r, &pos, version)")
                    elif elem == "uuid":
                        w("item = read_uuid(r, &pos)")
                    else:
                        reader = ("read_compact_" if flexible else "read_") + elem
                        w(f"item = {reader}(r, &pos, False)")
                    w("Py_INCREF(item)")
                    w("PyList_SET_ITEM(items, i, item)")
                    if f.struct is not None:
                        w("pause_point(r)")
                self.set(w, s, f, "items")
            elif elem in FIXED_TYPES:
                size = FIXED_TYPES[elem][1]
                value = f"read_fixed_array(r, &pos, n, {size}, {FIXED_READERS[elem]})"
                self.set(w, s, f, value)
            else:
                raise ValueError(f"cannot decode {f.type}")

    def emit_decode_tags(self, w: Writer, s: StructSpec) -> None:
        flex = self.flexible_in(s)
        if flex.empty:
            self.set(w, s, "_unknown_tagged_fields", "None")
            return
        test = range_test(flex.lo, flex.hi, s.context)
        body = Writer(w.level + (1 if test else 0))
        tagged = self.tagged_fields(s)
        body("need(r, pos, 1)")
        with body.block("if r.data[pos] == 0:"):  # the usual empty section: one zero byte
            body("pos += 1")
            self.set(body, s, "_unknown_tagged_fields", "None")
        with body.block("else:"):
            if not tagged:
                body("v, pos = _read_unknown_tags(<object>r.obj, pos)")
                self.set(body, s, "_unknown_tagged_fields", "v")
            else:
                self.emit_tag_loop(body, s, flex, tagged)
        if test:
            w(f"if {test}:")
            w.extend(body)
            with w.block("else:"):
                self.set(w, s, "_unknown_tagged_fields", "None")
        else:
            w.extend(body)

    def emit_tag_loop(
        self, w: Writer, s: StructSpec, flex: Versions, tagged: list[tuple[int, FieldSpec]]
    ) -> None:
        w("unknown = None")
        w("count, pos = _decode_uvarint(<object>r.obj, pos)")
        with w.block("for i in range(count):"):
            w("tag = read_uvarint(r, &pos)")
            w("size = read_uvarint(r, &pos)")
            w("end = pos + size")
            for i, (tag, f) in enumerate(tagged):
                tctx = f.tagged & s.context
                cond = [f"tag == {tag}"]
                vt = range_test(tctx.lo, tctx.hi, flex)
                if vt:
                    cond.append(vt)
                with w.block(f"{'if' if i == 0 else 'elif'} {' and '.join(cond)}:"):
                    self.emit_tagged_value(w, s, f, tctx, write=False)
            with w.block("else:"):
                w("unknown = _add_unknown_tag(unknown, tag, <object>r.obj, pos, end)")
                w("pos = end")
                w("continue")
            with w.block("if pos != end:"):
                w(f"raise _tag_size_mismatch({py_str(s.name)}, tag, size, size + pos - end)")
        self.set(w, s, "_unknown_tagged_fields", "unknown")

    def emit_tagged_value(
        self, w: Writer, s: StructSpec, f: FieldSpec, tctx: Versions, write: bool
    ) -> None:
        def emit(b: Writer, nullable: bool) -> None:
            self.emit_read(b, s, f, "", Layout("tagged", flexible=True, nullable=nullable))

        emit_chain(w, tctx, runs_of(tctx, lambda v: v in f.nullable), emit)


COMPILED_HEADER = """\
# cython: language_level=3
# Generated by tools/generate_protocol.py from the JSON definitions of Apache Kafka
# {kafka_version}. Do not edit; regenerate instead.
\"\"\"Compiled decoders of the responses kcore decodes often or in bulk ({names}).

Each ``decode_<module>(buf, version, pos=0)`` is ``<Class>.decode`` of the generated Python
class, compiled: it returns ``(object, next position)`` with an instance of that same class,
equal to what the Python decoder returns for the same bytes, and raises the same kcore error
class for bad bytes. ``DECODERS`` maps each class to its compiled decoder.
Arrays of {lazy} are StructArrays (see _decode_runtime.pxi), equal to
the Python decoder's lists.
\"\"\"

include "_decode_runtime.pxi"

import kcore.protocol.types as _types
"""

COMPILED_STUB = """\
\"\"\"Type stubs for the generated compiled decoders (src/kcore/protocol/_decoders.pyx).\"\"\"

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

DECODERS: dict[type[Any], Callable[[Any, int, int], tuple[Any, int]]]

class StructArray(Sequence[Any]):
    \"\"\"A decoded array of structs whose elements are made on first use (see the module).\"\"\"

    @property
    def element_type(self) -> type[Any]: ...
    @property
    def elements_made(self) -> bool: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...

{functions}
"""

COMPILED_PXD = """\
# Generated by tools/generate_protocol.py from the JSON definitions of Apache Kafka
# {kafka_version}. Do not edit; regenerate instead.
# What other compiled modules may use of kcore.protocol._decoders (cimport it): StructArray, an
# array of structs decoded on demand, and the raw structs its raw_at fills with an element's
# fields as C values. The runtime (_decode_runtime.pxi) implements what is declared here.

cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t


cdef struct Reader:
    const uint8_t* data
    Py_ssize_t size
    PyObject* obj  # the buffer object itself, for the Python helpers of the rare paths
    Py_ssize_t pause_every  # see pause_point; 0: never
    Py_ssize_t countdown
    PyObject* pause  # a callable, or NULL


ctypedef object (*ItemDecoder)(Reader*, Py_ssize_t*, int)
ctypedef int (*RawReader)(Reader*, Py_ssize_t*, int, void*) except -1

cdef enum:
    RAW_SCRATCH = {raw_scratch}  # bytes: room for any raw struct below


cdef inline int32_t raw_int32(const uint8_t* p) noexcept nogil:
    \"\"\"A big-endian int32 (the raw structs' arrays of int32 hold them so).\"\"\"
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


@cython.final
cdef class StructArray:
    cdef bytes data  # the elements' bytes, copied from the answer
    cdef Py_ssize_t n
    cdef int version
    cdef Py_ssize_t* offsets  # where each element starts in data
    cdef list items  # the elements as objects, once asked for
    cdef type item_type
    cdef ItemDecoder decode_item
    cdef RawReader read_raw

    cdef int raw_at(self, Py_ssize_t i, void* out) except -1  # element i's raw struct
    cdef list materialized(self)

{raw_structs}
"""


def generate_compiled(specs: list[MessageSpec], kafka_version: str) -> dict[str, str]:
    """``{file name: source}`` of the compiled decoders module and its stub."""
    by_name = {s.name: s for s in specs}
    gens = [CompiledDecoderGen(by_name[name], kafka_version) for name in COMPILED_DECODERS]
    w = Writer()
    w("import kcore.protocol.messages as _messages")
    for gen in gens:
        w(f"import kcore.protocol.messages.{gen.spec.module}")
    w()
    for gen in gens:
        gen.emit_globals(w)
        w()
    w()
    for gen in gens:
        gen.emit_decoders(w)
        w()
        w()
    w("DECODERS = {")
    for gen in gens:
        w(f"{INDENT}{gen.cls(gen.spec.root)}: {gen.entry()},")
    w("}")
    names = ", ".join(COMPILED_DECODERS)
    lazy = ", ".join(LAZY_STRUCTS)
    header = COMPILED_HEADER.format(kafka_version=kafka_version, names=names, lazy=lazy)
    pyx = header + "\n".join(w.lines)
    # Any, not the class: the stub then draws no generated module into the type check.
    functions = [
        f"def {g.entry()}(\n"
        f"    buf: bytes | bytearray | memoryview,\n"
        f"    version: int,\n"
        f"    pos: int = 0,\n"
        f"    pause_every: int = 0,\n"
        f"    pause: Callable[[], object] | None = None,\n"
        f") -> tuple[Any, int]: ...  # ({g.spec.name}, next position)"
        for g in gens
    ]
    pyi = COMPILED_STUB.format(functions="\n".join(functions))
    raw = Writer()
    for gen in gens:
        for s in gen.lazy_structs():
            raw()
            gen.emit_raw_struct(raw, s)
    pxd = COMPILED_PXD.format(
        kafka_version=kafka_version, raw_scratch=RAW_SCRATCH, raw_structs="\n".join(raw.lines)
    )
    return {
        f"{COMPILED_MODULE}.pyx": pyx + "\n",
        f"{COMPILED_MODULE}.pyi": pyi,
        f"{COMPILED_MODULE}.pxd": pxd.rstrip("\n") + "\n",
    }


# ---------------------------------------------------------------------------------------------
# Registry (messages/__init__.py)


# messages/__init__.py; the generator fills in {kafka_version}, {api_keys}, {apis} and {messages}.
REGISTRY_TEMPLATE = '''\
"""Kafka protocol messages, generated from the JSON definitions of Apache Kafka
{kafka_version} by tools/generate_protocol.py. Do not edit; regenerate instead.

One module per definition (``metadata_request``, ``consumer_protocol_subscription``, ...).
Nothing is imported until asked for: ``request_class(3)``, ``response_class(3)``,
``message_class("MetadataRequest")`` or ``messages.MetadataRequest`` import on first use.
"""

from __future__ import annotations

import importlib
from enum import IntEnum
from typing import Any, NamedTuple


class ApiKey(IntEnum):
    """Every API key by its name in Java's ``ApiKeys`` (``ApiKey.METADATA == 3``). Members are
    ints, so they go on the wire and compare with decoded keys as they are."""

{api_keys}


class ApiInfo(NamedTuple):
    """One Kafka API: its key, name, message classes and supported versions."""

    api_key: int
    name: str
    request: str  # request class name
    response: str  # response class name
    valid_versions: tuple[int, int] | None  # None: every version was removed
    flexible_versions: int | None  # first flexible version, if any
    latest_version_unstable: bool  # the highest version is still in development

    @property
    def max_stable_version(self) -> int | None:
        """The highest version a client should use unless it opts into unstable ones."""
        if self.valid_versions is None:
            return None
        lo, hi = self.valid_versions
        if self.latest_version_unstable and hi > lo:
            return hi - 1
        return hi


APIS: dict[int, ApiInfo] = {{
{apis}
}}

# API name -> key, e.g. API_KEYS["Metadata"] == 3.
API_KEYS: dict[str, int] = {{info.name: key for key, info in APIS.items()}}

# Class name -> module name, for every generated top-level message class.
MESSAGES: dict[str, str] = {{
{messages}
}}

_cache: dict[str, type[Any]] = {{}}


def message_class(name: str) -> type[Any]:
    """The generated class called ``name`` (e.g. ``"MetadataRequest"``), imported on first use."""
    cls = _cache.get(name)
    if cls is None:
        if name not in MESSAGES:
            raise KeyError(f"no generated message class {{name!r}}")
        module = importlib.import_module(f"{{__name__}}.{{MESSAGES[name]}}")
        cls = _cache[name] = getattr(module, name)
    return cls


def request_class(api_key: int) -> type[Any]:
    """The request class of an API key; ``KeyError`` for a key Kafka does not define."""
    return message_class(APIS[api_key].request)


def response_class(api_key: int) -> type[Any]:
    """The response class of an API key; ``KeyError`` for a key Kafka does not define."""
    return message_class(APIS[api_key].response)


def __getattr__(name: str) -> type[Any]:
    # PEP 562: ``messages.MetadataRequest`` imports its module on first access.
    if name in MESSAGES:
        return message_class(name)
    raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")


__all__ = [
    "APIS",
    "API_KEYS",
    "MESSAGES",
    "ApiInfo",
    "ApiKey",
    "message_class",
    "request_class",
    "response_class",
]
'''


def api_name(spec: MessageSpec) -> str:
    return spec.name[: -len("Request")] if spec.name.endswith("Request") else spec.name


def api_key_name(name: str) -> str:
    """An API name as Java's ``ApiKeys`` spells it: ``OffsetForLeaderEpoch`` ->
    ``OFFSET_FOR_LEADER_EPOCH`` (an underscore before each capital that follows a lower-case
    letter or digit, as Kafka's message generator does)."""
    out: list[str] = []
    for i, c in enumerate(name):
        if c.isupper() and i > 0 and not name[i - 1].isupper():
            out.append("_")
        out.append(c.upper())
    return "".join(out)


def generate_registry(specs: list[MessageSpec], kafka_version: str) -> str:
    requests = {s.api_key: s for s in specs if s.kind == "request" and s.api_key is not None}
    responses = {s.api_key: s for s in specs if s.kind == "response" and s.api_key is not None}
    if set(requests) != set(responses):
        raise ValueError("every request needs a response and vice versa")
    apis = Writer(level=1)
    for key in sorted(requests):
        req, resp = requests[key], responses[key]
        if req.valid != resp.valid:
            raise ValueError(f"API {key}: request and response versions differ")
        flex = req.flexible.lo if not req.flexible.empty else None
        args = [
            str(key),
            py_str(api_name(req)),
            py_str(req.name),
            py_str(resp.name),
            repr(req.valid.as_tuple()),
            repr(flex),
            repr(req.latest_unstable),
        ]
        apis.wrapped(f"{key}: ApiInfo(", args, "),")
    key_names = {key: api_key_name(api_name(requests[key])) for key in sorted(requests)}
    if len(set(key_names.values())) != len(key_names) or not all(
        n.isidentifier() and not n.startswith("_") for n in key_names.values()
    ):
        raise ValueError(f"API names do not make distinct enum names: {key_names}")
    api_keys = "\n".join(f"{INDENT}{name} = {key}" for key, name in key_names.items())
    messages = [f"{INDENT}{py_str(s.name)}: {py_str(s.module)}," for s in specs]
    return REGISTRY_TEMPLATE.format(
        kafka_version=kafka_version,
        api_keys=api_keys,
        apis="\n".join(apis.lines),
        messages="\n".join(sorted(messages)),
    )


# ---------------------------------------------------------------------------------------------
# Driver


def generate(sources: dict[str, str], kafka_version: str) -> dict[str, str]:
    """``{file name: source}`` of every module of the messages package."""
    specs = load_specs(sources)
    files = {f"{spec.module}.py": ModuleGen(spec, kafka_version).generate() for spec in specs}
    files["__init__.py"] = generate_registry(specs, kafka_version)
    return dict(sorted(files.items()))


def write_files(files: dict[str, str], out: Path, *, own_dir: bool = True) -> None:
    """Write what changed; with ``own_dir`` (the messages package) also remove ``.py`` files
    this script no longer makes. The compiled decoders share their directory with
    hand-written modules: they are written with ``own_dir=False``."""
    out.mkdir(parents=True, exist_ok=True)
    if own_dir:
        for stale in out.glob("*.py"):
            if stale.name not in files:
                stale.unlink()
    for name, text in files.items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def check_files(files: dict[str, str], out: Path, *, own_dir: bool = True) -> list[str]:
    """Names of files in ``out`` that differ from ``files``, are missing, or (``own_dir``)
    are extra."""
    problems = []
    for name, text in files.items():
        path = out / name
        if not path.exists():
            problems.append(f"{name} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name} (differs)")
    if own_dir and out.is_dir():
        for path in sorted(out.glob("*.py")):
            if path.name not in files:
                problems.append(f"{path.name} (not generated by this script)")
    return problems


def default_kafka_version() -> str:
    sys.path.insert(0, str(REPO / "src"))
    from kcore.testing.versions import PROTOCOL_SOURCE_VERSION

    return PROTOCOL_SOURCE_VERSION


def find_jar(version: str) -> Path:
    sys.path.insert(0, str(REPO))
    from tools.kafka_jar import kafka_clients_jar

    return kafka_clients_jar(version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jar", type=Path, help="kafka-clients jar (default: fetch with Maven)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--kafka-version",
        help="Kafka release named in the generated headers "
        "(default: kcore.testing.versions.PROTOCOL_SOURCE_VERSION)",
    )
    parser.add_argument(
        "--compiled-out",
        type=Path,
        help="where the compiled decoders (_decoders.pyx/.pyi/.pxd) go "
        "(default: the parent of --out)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the output directory is stale",
    )
    parser.add_argument("--diff", action="store_true", help="with --check, print a diff")
    args = parser.parse_args(argv)
    version = args.kafka_version or default_kafka_version()
    jar = args.jar or find_jar(version)
    sources = read_jar_sources(jar)
    files = generate(sources, version)
    compiled = generate_compiled(load_specs(sources), version)
    compiled_out = args.compiled_out or args.out.parent
    if args.check:
        problems = check_files(files, args.out) + check_files(compiled, compiled_out, own_dir=False)
        if problems:
            print(f"{args.out}: {len(problems)} stale file(s); run tools/generate_protocol.py:")
            for p in problems:
                print(f"  {p}")
            if args.diff:
                print_diff(files, args.out)
                print_diff(compiled, compiled_out)
            return 1
        print(f"{args.out}: up to date ({len(files)} files)")
        return 0
    write_files(files, args.out)
    write_files(compiled, compiled_out, own_dir=False)
    print(f"wrote {len(files)} files to {args.out} and {len(compiled)} to {compiled_out}")
    return 0


def print_diff(files: dict[str, str], out: Path) -> None:
    for name, text in files.items():
        path = out / name
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old != text:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(True), text.splitlines(True), f"a/{name}", f"b/{name}"
                )
            )


if __name__ == "__main__":
    sys.exit(main())
