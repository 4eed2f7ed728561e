"""Java ``.properties`` files as ``java.util.Properties.load`` reads them, for ``-F``: the
client.properties people already have for ``--command-config`` and ``kcat -F`` must mean the
same here (a multi-line ``sasl.jaas.config``, ``key: value`` and ``key value`` lines,
escapes)."""

from __future__ import annotations

import os
import re

from kcore.errors import KcoreError

__all__ = ["load_properties", "parse_properties"]

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_SEPARATORS = "=: \t\f"
_WHITESPACE = " \t\f"


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """The settings of a properties file. UTF-8 (what Java 9+ tools write), else ISO-8859-1
    (what ``Properties.load`` of a stream assumes); an unreadable file is a KcoreError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise KcoreError(f"-F {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    if "\x00" in text:
        raise KcoreError(f"-F {path}: not a properties file (it holds NUL bytes)")
    return parse_properties(text)


def parse_properties(text: str) -> dict[str, str]:
    """``text`` read by Java's rules: ``#``/``!`` comment lines; a line ending in an odd number
    of backslashes goes on with the next (whose leading whitespace is dropped); the key ends at
    the first unescaped ``=``, ``:`` or whitespace; ``\\t \\n \\r \\f \\uXXXX`` escapes, any
    other escaped character stands for itself. A later key wins."""
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        out[_unescape(key)] = _unescape(value)
    return out


def _logical_lines(text: str) -> list[str]:
    lines = re.split(r"\r\n|\r|\n", text)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue  # a comment never continues, whatever it ends with
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(_WHITESPACE)
            i += 1
        if _continues(line):  # a backslash at the very end of the file
            line = line[:-1]
        out.append(line)
    return out


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in _SEPARATORS:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise KcoreError(f"malformed \\uxxxx escape in properties: {text[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)
