"""Runtime helpers shared by the generated protocol messages (``kcore.protocol.messages``).

The generated encoders and decoders inline fixed-width fields (one precompiled ``struct.Struct``
per run of adjacent fixed-width fields) and call the small functions below for everything of
variable length: strings, bytes, records, uuids, arrays of primitives and tagged-field sections.

Conventions every reader follows: ``read_x(buf, pos) -> (value, next_pos)``; ``buf`` is
``bytes``, ``bytearray`` or a byte ``memoryview``. Every writer appends to a ``bytearray``:
``write_x(out, value) -> None``. Readers raise :class:`~kcore.errors.TruncatedDataError` when a
length points past the end of the input and :class:`~kcore.errors.InvalidLengthError` for a null
where the schema does not allow one; the message-level ``decode`` (see :func:`run_decoder`) turns
the ``struct.error``/``IndexError`` that inlined reads raise on short input into
``TruncatedDataError`` too, so no low-level exception escapes.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kcore._codec import decode_uvarint, encode_uvarint
from kcore.errors import (
    InvalidLengthError,
    ProtocolError,
    TruncatedDataError,
    UnsupportedVersionError,
)

__all__ = [
    "FieldInfo",
    "FrameBuffer",
    "InvalidLengthError",
    "MAX_VERSION",
    "MISSING",
    "Message",
    "ZERO_UUID",
    "add_unknown_tag",
    "array_too_long",
    "check_array_length",
    "check_version",
    "decode_uvarint",
    "encode_uvarint",
    "field_not_in_version",
    "null_not_allowed",
    "read_bytes",
    "read_compact_bytes",
    "read_compact_nullable_bytes",
    "read_compact_nullable_string",
    "read_compact_records",
    "read_compact_string",
    "read_fixed_array",
    "read_nullable_bytes",
    "read_nullable_string",
    "read_object_array",
    "read_records",
    "read_string",
    "read_unknown_tags",
    "read_uuid",
    "run_decoder",
    "run_encoder",
    "tag_size_mismatch",
    "write_bytes",
    "write_compact_bytes",
    "write_compact_length",
    "write_compact_nullable_bytes",
    "write_compact_nullable_records",
    "write_compact_records",
    "write_compact_nullable_string",
    "write_compact_string",
    "write_fixed_array",
    "write_length",
    "write_records",
    "write_nullable_bytes",
    "write_nullable_records",
    "write_nullable_string",
    "write_string",
    "write_tags",
    "write_uuid",
]

# The "+" in a schema's version range ("3+") is open-ended; versions are int16 on the wire.
MAX_VERSION = 0x7FFF

ZERO_UUID = uuid.UUID(int=0)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_NULL16 = b"\xff\xff"
_NULL32 = b"\xff\xff\xff\xff"


class _Missing:
    """Default of ``__init__`` parameters whose real default is a fresh mutable object (a list
    or a struct): ``None`` cannot be the marker because it is a legal (null) value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FieldInfo(NamedTuple):
    """Schema facts about one field of a generated class (``cls.FIELDS``), for introspection
    and tests. Version ranges are ``(lo, hi)`` inclusive, ``hi`` = :data:`MAX_VERSION` for an
    open range, or ``None`` for "no version"."""

    attr: str  # snake_case attribute name
    name: str  # the schema's CamelCase name
    type: str  # schema type: "int32", "string", "[]int32", "[]SomeStruct", "SomeStruct", ...
    versions: tuple[int, int] | None
    nullable_versions: tuple[int, int] | None
    tagged_versions: tuple[int, int] | None
    tag: int | None
    ignorable: bool


# ---------------------------------------------------------------------------------------------
# Base class of every generated struct.


class Message:
    """Base of the generated classes: ``encode`` and a readable repr. Subclasses define
    ``__slots__``, ``FIELDS``, ``__init__``, ``__eq__``, ``encode_into`` and ``decode``."""

    __slots__ = ()

    API_KEY: int | None = None
    NAME: str = ""
    VALID_VERSIONS: tuple[int, int] | None = None
    FLEXIBLE_VERSIONS: int | None = None
    FIELDS: tuple[FieldInfo, ...] = ()

    # Mutable objects: equal by value, hence not hashable.
    __hash__ = None  # type: ignore[assignment]

    def encode_into(self, out: bytearray, version: int) -> None:  # pragma: no cover - generated
        raise NotImplementedError

    def encode(self, version: int) -> bytes:
        """Serialize at ``version``; see ``encode_into``."""
        out = bytearray()
        self.encode_into(out, version)
        return bytes(out)

    def __repr__(self) -> str:
        parts = [f"{f.attr}={getattr(self, f.attr)!r}" for f in self.FIELDS]
        unknown = getattr(self, "_unknown_tagged_fields", None)
        if unknown:
            parts.append(f"_unknown_tagged_fields={unknown!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


def check_version(cls: type[Message], version: int) -> None:
    """Raise ``UnsupportedVersionError`` unless ``version`` is in ``cls.VALID_VERSIONS``."""
    valid = cls.VALID_VERSIONS
    if valid is None or not valid[0] <= version <= valid[1]:
        span = "no versions" if valid is None else f"versions {valid[0]}-{valid[1]}"
        raise UnsupportedVersionError(f"{cls.NAME} has {span}; version {version} requested")


def run_encoder(
    obj: Message, fn: Callable[[Any, bytearray, int], None], out: bytearray, version: int
) -> None:
    """Check the version, run a generated encoder, and on failure leave ``out`` as it was and
    report value errors with the message name (``struct.error`` is not a ``ValueError``)."""
    check_version(type(obj), version)
    start = len(out)
    try:
        fn(obj, out, version)
    except (struct.error, ValueError, OverflowError) as exc:
        _truncate(out, start)
        raise ValueError(f"cannot encode {obj.NAME} v{version}: {exc}") from exc
    except BaseException:
        _truncate(out, start)
        raise


def _truncate(out: bytearray, size: int) -> None:
    del out[size:]
    if type(out) is FrameBuffer:
        out.splices = [(p, b) for p, b in out.splices if p < size]


def run_decoder(
    cls: type[Message],
    fn: Callable[[Any, int, int], tuple[Any, int]],
    buf: Any,
    version: int,
    pos: int,
) -> tuple[Any, int]:
    """Check the version and run a generated decoder, turning the low-level errors of inlined
    reads on short or malformed input into kcore errors."""
    check_version(cls, version)
    try:
        return fn(buf, pos, version)
    except (struct.error, IndexError) as exc:
        raise TruncatedDataError(f"{cls.NAME} v{version}: input ends early ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{cls.NAME} v{version}: a string is not valid UTF-8") from exc


def field_not_in_version(cls_name: str, field: str, version: int) -> UnsupportedVersionError:
    """The error for a non-default value in a non-ignorable field that ``version`` lacks."""
    return UnsupportedVersionError(
        f"{cls_name}.{field} is set to a non-default value but does not exist in version "
        f"{version} (and is not ignorable)"
    )


def null_not_allowed(what: str) -> ValueError:
    return ValueError(f"{what} is null but not nullable in this version")


def tag_size_mismatch(cls_name: str, tag: int, size: int, used: int) -> ProtocolError:
    return ProtocolError(
        f"{cls_name}: tagged field {tag} declares {size} bytes but its value takes {used}"
    )


# ---------------------------------------------------------------------------------------------
# Lengths. Non-flexible versions use int16 (strings) / int32 (bytes, arrays) lengths with -1 for
# null; flexible ("compact") versions use an unsigned varint of length + 1 with 0 for null.


def _past_end(pos: int, end: int) -> TruncatedDataError:
    return TruncatedDataError(f"a length of {end - pos} runs past the end of the input", pos)


def write_length(out: bytearray, n: int) -> None:
    """int32 length (or -1 for null) of a non-flexible array or bytes field."""
    out += _I32.pack(n)


def write_compact_length(out: bytearray, n: int) -> None:
    """Compact length of an array or bytes field; ``n = -1`` writes null."""
    n += 1
    if n < 0x80:
        out.append(n)
    else:
        out += encode_uvarint(n)


# ---------------------------------------------------------------------------------------------
# Strings (UTF-8), bytes (copied out as ``bytes``) and records (a zero-copy ``memoryview`` of the
# input). These readers run once per string of every response, so each one inlines its length
# read, its bounds check and, for compact lengths, the one-byte varint case.


def read_string(buf: Any, pos: int) -> tuple[str, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        raise InvalidLengthError("null in a non-nullable string", pos - 2)
    end = pos + n
    if end > len(buf):
        raise _past_end(pos, end)
    if type(buf) is bytes:  # bytes.decode is faster than str(view, "utf-8")
        return buf[pos:end].decode(), end
    return str(buf[pos:end], "utf-8"), end


def read_nullable_string(buf: Any, pos: int) -> tuple[str | None, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise _past_end(pos, end)
    if type(buf) is bytes:
        return buf[pos:end].decode(), end
    return str(buf[pos:end], "utf-8"), end


def read_compact_string(buf: Any, pos: int) -> tuple[str, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = decode_uvarint(buf, pos)
    if n == 0:
        raise InvalidLengthError("null in a non-nullable compact string", pos - 1)
    end = pos + n - 1
    if end > len(buf):
        raise _past_end(pos, end)
    if type(buf) is bytes:
        return buf[pos:end].decode(), end
    return str(buf[pos:end], "utf-8"), end


def read_compact_nullable_string(buf: Any, pos: int) -> tuple[str | None, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = decode_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(buf):
        raise _past_end(pos, end)
    if type(buf) is bytes:
        return buf[pos:end].decode(), end
    return str(buf[pos:end], "utf-8"), end


def write_string(out: bytearray, s: str) -> None:
    if s is None:
        raise null_not_allowed("a string")
    b = s.encode("utf-8")
    out += _I16.pack(len(b))
    out += b


def write_nullable_string(out: bytearray, s: str | None) -> None:
    if s is None:
        out += _NULL16
    else:
        b = s.encode("utf-8")
        out += _I16.pack(len(b))
        out += b


def write_compact_string(out: bytearray, s: str) -> None:
    if s is None:
        raise null_not_allowed("a string")
    b = s.encode("utf-8")
    write_compact_length(out, len(b))
    out += b


def write_compact_nullable_string(out: bytearray, s: str | None) -> None:
    if s is None:
        out.append(0)
    else:
        b = s.encode("utf-8")
        write_compact_length(out, len(b))
        out += b


def read_bytes(buf: Any, pos: int) -> tuple[bytes, int]:
    (n,) = _I32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        raise InvalidLengthError("null in a non-nullable bytes field", pos - 4)
    end = pos + n
    if end > len(buf):
        raise _past_end(pos, end)
    return bytes(buf[pos:end]), end


def read_nullable_bytes(buf: Any, pos: int) -> tuple[bytes | None, int]:
    (n,) = _I32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise _past_end(pos, end)
    return bytes(buf[pos:end]), end


def read_compact_bytes(buf: Any, pos: int) -> tuple[bytes, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = decode_uvarint(buf, pos)
    if n == 0:
        raise InvalidLengthError("null in a non-nullable bytes field", pos - 1)
    end = pos + n - 1
    if end > len(buf):
        raise _past_end(pos, end)
    return bytes(buf[pos:end]), end


def read_compact_nullable_bytes(buf: Any, pos: int) -> tuple[bytes | None, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = decode_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(buf):
        raise _past_end(pos, end)
    return bytes(buf[pos:end]), end


def read_records(buf: Any, pos: int) -> tuple[memoryview | None, int]:
    """Records are nullable bytes handed on undecoded: a view of ``buf``, not a copy."""
    (n,) = _I32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise _past_end(pos, end)
    return memoryview(buf)[pos:end], end


def read_compact_records(buf: Any, pos: int) -> tuple[memoryview | None, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = decode_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(buf):
        raise _past_end(pos, end)
    return memoryview(buf)[pos:end], end


def write_bytes(out: bytearray, b: Any) -> None:
    if b is None:
        raise null_not_allowed("a bytes or records field")
    out += _I32.pack(len(b))
    out += b


def write_nullable_bytes(out: bytearray, b: Any) -> None:
    if b is None:
        out += _NULL32
    else:
        out += _I32.pack(len(b))
        out += b


def write_compact_bytes(out: bytearray, b: Any) -> None:
    if b is None:
        raise null_not_allowed("a bytes or records field")
    write_compact_length(out, len(b))
    out += b


def write_compact_nullable_bytes(out: bytearray, b: Any) -> None:
    if b is None:
        out.append(0)
    else:
        write_compact_length(out, len(b))
        out += b


# Records (record batches): as bytes, except that a large batch written into a FrameBuffer is
# not copied but spliced in (a Produce request's megabytes go to the socket from the batch's
# own buffer, see KafkaProtocol.send_request_segments).

# Smaller records fields are copied into the frame: a separate buffer costs more than the copy.
# Larger ones are not: a producer's batch at Java's 16 KiB batch.size (which ends a little
# under it) was copied, reading every batch once more on the network thread.
SPLICE_MIN = 4096


class FrameBuffer(bytearray):
    """A request being encoded whose records fields may be held by reference: ``splices`` are
    ``(position, buffer)``, each buffer's bytes belonging at that position of the frame."""

    __slots__ = ("splices",)

    def __init__(self, size: int = 0) -> None:
        super().__init__(size)
        self.splices: list[tuple[int, Any]] = []


def _put_records(out: bytearray, b: Any) -> None:
    # Only bytes, which cannot change: a caller's bytearray could be reused before it is sent.
    if type(out) is FrameBuffer and type(b) is bytes and len(b) >= SPLICE_MIN:
        out.splices.append((len(out), b))
    else:
        out += b


def write_records(out: bytearray, b: Any) -> None:
    if b is None:
        raise null_not_allowed("a bytes or records field")
    out += _I32.pack(len(b))
    _put_records(out, b)


def write_nullable_records(out: bytearray, b: Any) -> None:
    if b is None:
        out += _NULL32
    else:
        out += _I32.pack(len(b))
        _put_records(out, b)


def write_compact_records(out: bytearray, b: Any) -> None:
    if b is None:
        raise null_not_allowed("a bytes or records field")
    write_compact_length(out, len(b))
    _put_records(out, b)


def write_compact_nullable_records(out: bytearray, b: Any) -> None:
    if b is None:
        out.append(0)
    else:
        write_compact_length(out, len(b))
        _put_records(out, b)


# ---------------------------------------------------------------------------------------------
# UUIDs: ``uuid.UUID`` in Python, 16 big-endian bytes on the wire.


def read_uuid(buf: Any, pos: int) -> tuple[uuid.UUID, int]:
    end = pos + 16
    if end > len(buf):
        raise _past_end(pos, end)
    return uuid.UUID(bytes=bytes(buf[pos:end])), end


def write_uuid(out: bytearray, u: uuid.UUID) -> None:
    out += u.bytes


# ---------------------------------------------------------------------------------------------
# Arrays whose elements are not structs (structs are looped over in the generated code).


# Precompiled ``struct.Struct`` for the short arrays nearly every response has (replica lists):
# formatting and looking up a format string per call costs more than the unpacking itself.
_SMALL_ARRAY = 32
_ARRAY_STRUCTS = {
    code: [struct.Struct(f">{n}{code}") for n in range(_SMALL_ARRAY)] for code in "bhHiIqd?"
}


def read_fixed_array(buf: Any, pos: int, n: int, code: str, size: int) -> tuple[list[Any], int]:
    """``n`` fixed-width values of ``struct`` format ``code`` (``"i"``, ``"q"``, ...)."""
    end = pos + n * size
    if end > len(buf):
        raise _past_end(pos, end)
    if n < _SMALL_ARRAY:
        return list(_ARRAY_STRUCTS[code][n].unpack_from(buf, pos)), end
    return list(struct.unpack_from(f">{n}{code}", buf, pos)), end


def write_fixed_array(out: bytearray, values: Sequence[Any], code: str) -> None:
    """The elements only; the caller writes the length."""
    n = len(values)
    if n < _SMALL_ARRAY:
        out += _ARRAY_STRUCTS[code][n].pack(*values)
    else:
        out += struct.pack(f">{n}{code}", *values)


def read_object_array(
    buf: Any, pos: int, n: int, reader: Callable[[Any, int], tuple[Any, int]]
) -> tuple[list[Any], int]:
    """``n`` variable-width values (strings, uuids) read one by one with ``reader``."""
    items: list[Any] = []
    append = items.append
    for _ in range(n):
        item, pos = reader(buf, pos)
        append(item)
    return items, pos


def check_array_length(buf: Any, pos: int, n: int) -> None:
    """Refuse an element count larger than the bytes left: a corrupt or hostile count must not
    make us loop (or allocate) billions of times before running out of input."""
    if n > len(buf) - pos:
        raise array_too_long(n, pos)


def array_too_long(n: int, pos: int) -> TruncatedDataError:
    return TruncatedDataError(f"an array of {n} elements cannot fit in the rest of the input", pos)


# ---------------------------------------------------------------------------------------------
# Tagged fields: uvarint count, then per field uvarint tag, uvarint size, ``size`` bytes.


def read_unknown_tags(buf: Any, pos: int) -> tuple[list[tuple[int, bytes]] | None, int]:
    """Read a tagged-field section of a struct that knows no tags in this version, keeping
    every field as raw ``(tag, bytes)`` so that re-encoding reproduces it."""
    count, pos = decode_uvarint(buf, pos)
    if count == 0:
        return None, pos
    fields: list[tuple[int, bytes]] = []
    for _ in range(count):
        tag, pos = decode_uvarint(buf, pos)
        size, pos = decode_uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise _past_end(pos, end)
        fields.append((tag, bytes(buf[pos:end])))
        pos = end
    return fields, pos


def add_unknown_tag(
    fields: list[tuple[int, bytes]] | None, tag: int, buf: Any, pos: int, end: int
) -> list[tuple[int, bytes]]:
    if end > len(buf):
        raise _past_end(pos, end)
    if fields is None:
        fields = []
    fields.append((tag, bytes(buf[pos:end])))
    return fields


def write_tags(
    out: bytearray,
    known: list[tuple[int, Any]],
    unknown: list[tuple[int, bytes]] | None,
) -> None:
    """Write a tagged-field section: ``known`` (already in tag order) merged with preserved
    unknown fields, sorted by tag as the protocol requires."""
    fields = sorted(known + list(unknown), key=_first) if unknown else known
    n = len(fields)
    if n < 0x80:
        out.append(n)
    else:
        out += encode_uvarint(n)
    for tag, data in fields:
        out += encode_uvarint(tag)
        out += encode_uvarint(len(data))
        out += data


def _first(item: tuple[int, Any]) -> int:
    return item[0]
