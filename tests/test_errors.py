"""kcore.errors: the classes generated from Kafka's ``Errors`` enum, the lookup helpers, pickling,
and that the committed ``_codes.py`` matches what ``tools/generate_errors.py`` produces."""

from __future__ import annotations

import ast
import enum
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import kcore.errors as errors
from kcore.errors import (
    ERRORS_BY_CODE,
    ERRORS_BY_NAME,
    RETRIABLE_CODES,
    ConfigError,
    CorruptRecordError,
    CrcMismatchError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    NotLeaderOrFollowerError,
    ProtocolError,
    TruncatedDataError,
    UnknownKafkaErrorCode,
    UnknownServerError,
    error_for_code,
)

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import generate_errors  # noqa: E402

ALL_CLASSES = sorted(ERRORS_BY_CODE.values(), key=lambda c: c.code)


# --- the generated table ----------------------------------------------------------------------


def test_table_shape() -> None:
    assert 0 not in ERRORS_BY_CODE
    assert len(ERRORS_BY_CODE) == len(ERRORS_BY_NAME) > 100
    assert -1 in ERRORS_BY_CODE  # UNKNOWN_SERVER_ERROR
    assert set(ERRORS_BY_CODE.values()) == set(ERRORS_BY_NAME.values())
    assert RETRIABLE_CODES <= ERRORS_BY_CODE.keys()
    assert isinstance(RETRIABLE_CODES, frozenset)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_every_code_has_a_consistent_class(cls: type[KafkaError]) -> None:
    assert issubclass(cls, KafkaError)
    assert ERRORS_BY_CODE[cls.code] is cls
    assert ERRORS_BY_NAME[cls.name] is cls
    assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", cls.name)
    assert cls.__name__ == generate_errors.class_name_for(cls.name)
    assert cls.__name__.endswith("Error") and not cls.__name__.endswith("ErrorError")
    assert type(cls.code) is int and type(cls.retriable) is bool
    assert isinstance(cls.default_message, str) and cls.default_message
    assert cls.retriable == (cls.code in RETRIABLE_CODES)
    # Exported from the package under its own name, and listed in __all__.
    assert getattr(errors, cls.__name__) is cls
    assert cls.__name__ in errors.__all__
    # The class attributes are the class's own, not inherited from KafkaError's defaults.
    assert {"code", "name", "retriable", "default_message"} <= vars(cls).keys()


def test_error_code_enum_names_every_code() -> None:
    assert issubclass(ErrorCode, enum.IntEnum)
    assert ErrorCode.NONE == 0
    assert ErrorCode.UNKNOWN_SERVER_ERROR == -1
    assert {m.value for m in ErrorCode} == {0, *ERRORS_BY_CODE}
    assert len(ErrorCode) == len(ERRORS_BY_CODE) + 1  # no aliases: one member per code
    for member in ErrorCode:
        if member is ErrorCode.NONE:
            continue
        assert ERRORS_BY_CODE[member].name == member.name
        assert ERRORS_BY_NAME[member.name].code == member
    assert error_for_code(ErrorCode.NONE) is None
    assert type(error_for_code(ErrorCode.NOT_LEADER_OR_FOLLOWER)) is NotLeaderOrFollowerError


def test_exports() -> None:
    assert len(errors.__all__) == len(set(errors.__all__))
    for name in errors.__all__:
        assert hasattr(errors, name), name
    for name in (
        "KafkaError",
        "ConfigError",
        "error_for_code",
        "ERRORS_BY_CODE",
        "ERRORS_BY_NAME",
        "RETRIABLE_CODES",
        "UnknownKafkaErrorCode",
        "ErrorCode",
    ):
        assert name in errors.__all__
    namespace: dict[str, object] = {}
    exec("from kcore.errors import *", namespace)
    assert namespace["NotLeaderOrFollowerError"] is NotLeaderOrFollowerError


# Against Kafka's protocol error table (https://kafka.apache.org/protocol#protocol_error_codes).
@pytest.mark.parametrize(
    ("name", "code", "retriable", "class_name"),
    [
        ("UNKNOWN_SERVER_ERROR", -1, False, "UnknownServerError"),
        ("OFFSET_OUT_OF_RANGE", 1, False, "OffsetOutOfRangeError"),
        ("UNKNOWN_TOPIC_OR_PARTITION", 3, True, "UnknownTopicOrPartitionError"),
        ("LEADER_NOT_AVAILABLE", 5, True, "LeaderNotAvailableError"),
        ("NOT_LEADER_OR_FOLLOWER", 6, True, "NotLeaderOrFollowerError"),
        ("REQUEST_TIMED_OUT", 7, True, "RequestTimedOutError"),
        ("MESSAGE_TOO_LARGE", 10, False, "MessageTooLargeError"),
        ("NETWORK_EXCEPTION", 13, True, "NetworkError"),
        ("COORDINATOR_LOAD_IN_PROGRESS", 14, True, "CoordinatorLoadInProgressError"),
        ("NOT_COORDINATOR", 16, True, "NotCoordinatorError"),
        ("INVALID_TOPIC_EXCEPTION", 17, False, "InvalidTopicError"),
        ("REBALANCE_IN_PROGRESS", 27, False, "RebalanceInProgressError"),
        ("TOPIC_AUTHORIZATION_FAILED", 29, False, "TopicAuthorizationFailedError"),
        ("GROUP_AUTHORIZATION_FAILED", 30, False, "GroupAuthorizationFailedError"),
        ("UNSUPPORTED_VERSION", 35, False, "UnsupportedVersionError"),
        ("TOPIC_ALREADY_EXISTS", 36, False, "TopicAlreadyExistsError"),
        ("KAFKA_STORAGE_ERROR", 56, True, "KafkaStorageError"),
        ("FENCED_LEADER_EPOCH", 74, True, "FencedLeaderEpochError"),
        ("UNKNOWN_LEADER_EPOCH", 75, True, "UnknownLeaderEpochError"),
        ("UNKNOWN_TOPIC_ID", 100, True, "UnknownTopicIdError"),
    ],
)
def test_known_codes(name: str, code: int, retriable: bool, class_name: str) -> None:
    cls = ERRORS_BY_NAME[name]
    assert cls is ERRORS_BY_CODE[code]
    assert cls is getattr(errors, class_name)
    assert (cls.code, cls.name, cls.retriable) == (code, name, retriable)
    assert (code in RETRIABLE_CODES) is retriable


def test_class_names() -> None:
    f = generate_errors.class_name_for
    assert f("UNKNOWN_SERVER_ERROR") == "UnknownServerError"
    assert f("NOT_LEADER_OR_FOLLOWER") == "NotLeaderOrFollowerError"
    assert f("UNSUPPORTED_VERSION") == "UnsupportedVersionError"
    assert f("NETWORK_EXCEPTION") == "NetworkError"
    assert f("FETCH_SESSION_TOPIC_ID_ERROR") == "FetchSessionTopicIdError"
    assert f("INVALID_TXN_STATE") == "InvalidTxnStateError"


# --- error_for_code ---------------------------------------------------------------------------


def test_error_for_code_none() -> None:
    assert error_for_code(0) is None
    assert error_for_code(0, "ignored") is None


def test_error_for_code_known() -> None:
    e = error_for_code(6)
    assert type(e) is NotLeaderOrFollowerError
    assert e.code == 6 and e.retriable
    assert e.message == NotLeaderOrFollowerError.default_message
    assert str(e) == f"[NOT_LEADER_OR_FOLLOWER (6)] {NotLeaderOrFollowerError.default_message}"
    e = error_for_code(29, "Not authorized to access topics: [secret]")
    assert type(e) is errors.TopicAuthorizationFailedError
    assert e.message == "Not authorized to access topics: [secret]"
    assert str(e) == "[TOPIC_AUTHORIZATION_FAILED (29)] Not authorized to access topics: [secret]"
    for code, cls in ERRORS_BY_CODE.items():
        assert type(error_for_code(code)) is cls


@pytest.mark.parametrize("code", [9999, 32767, -2, -32768])
def test_error_for_code_unknown(code: int) -> None:
    e = error_for_code(code)
    assert type(e) is UnknownKafkaErrorCode
    assert isinstance(e, UnknownServerError) and isinstance(e, KafkaError)
    assert e.code == code and str(code) in str(e)
    assert e.name == "UNKNOWN_SERVER_ERROR" and e.retriable is False
    assert code not in RETRIABLE_CODES
    # The instance's code does not leak into the class or the table.
    assert UnknownServerError.code == -1 and UnknownKafkaErrorCode.code == -1
    assert code not in ERRORS_BY_CODE
    e = error_for_code(code, "from a newer broker")
    assert e is not None and e.message == "from a newer broker"
    # Reworded (naming a call or partition), it keeps its class and code.
    again = e.with_message("t-0: from a newer broker")
    assert type(again) is UnknownKafkaErrorCode and again.code == code
    assert str(again) == f"[UNKNOWN_SERVER_ERROR ({code})] t-0: from a newer broker"
    assert str(e) == f"[UNKNOWN_SERVER_ERROR ({code})] from a newer broker"


# --- raising, catching, pickling --------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_raise_and_catch(cls: type[KafkaError]) -> None:
    with pytest.raises(cls):
        raise cls()
    with pytest.raises(KafkaError) as info:
        raise cls("custom")
    assert info.value.message == "custom"
    with pytest.raises(KcoreError):
        raise cls()
    with pytest.raises(Exception):  # noqa: B017 - catchable by a plain ``except Exception``
        raise cls()


def test_raise_error_for_code() -> None:
    err = error_for_code(14)
    assert err is not None
    with pytest.raises(errors.CoordinatorLoadInProgressError):
        raise err
    unknown = error_for_code(4242)
    assert unknown is not None
    with pytest.raises(UnknownServerError):
        raise unknown


def _roundtrip(e: BaseException) -> BaseException:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(e, protocol=protocol))
        assert type(copy) is type(e)
        assert str(copy) == str(e) and copy.args == e.args
        assert vars(copy) == vars(e)
    return copy


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_pickle_every_class(cls: type[KafkaError]) -> None:
    for e in (cls(), cls("broker said: no")):
        copy = _roundtrip(e)
        assert isinstance(copy, KafkaError)
        assert (copy.code, copy.message) == (e.code, e.message)


def test_pickle_unknown_code() -> None:
    e = error_for_code(31337, "what is this")
    assert e is not None
    copy = _roundtrip(e)
    assert isinstance(copy, UnknownKafkaErrorCode)
    assert copy.code == 31337 and copy.message == "what is this"
    again = _roundtrip(UnknownKafkaErrorCode(777))
    assert isinstance(again, UnknownKafkaErrorCode)
    assert again.code == 777 and "777" in str(again)


def test_pickle_keeps_extra_state() -> None:
    e = NotLeaderOrFollowerError("moved")
    e.topic = "t"  # type: ignore[attr-defined]
    if hasattr(e, "add_note"):  # Python 3.11+
        e.add_note("while fetching t-0")
    copy = _roundtrip(e)
    assert copy.topic == "t"  # type: ignore[attr-defined]
    assert getattr(copy, "__notes__", None) == getattr(e, "__notes__", None)


@pytest.mark.parametrize(
    "e",
    [
        KcoreError("plain"),
        ConfigError("linger.ms", "must be >= 0"),
        KcoreTimeoutError("metadata not ready after 5000 ms"),
        ProtocolError("correlation id 7 does not match any request"),
        CorruptRecordError("bad record"),
        CrcMismatchError("CRC mismatch", 61),
        TruncatedDataError("ends inside a batch header", 0),
    ],
    ids=lambda e: type(e).__name__,
)
def test_pickle_kcore_errors(e: KcoreError) -> None:
    copy = _roundtrip(e)
    if isinstance(e, ConfigError):
        assert isinstance(copy, ConfigError)
        assert (copy.key, copy.message) == ("linger.ms", "must be >= 0")
    if isinstance(e, CorruptRecordError):
        assert isinstance(copy, CorruptRecordError)
        assert copy.position == e.position


# --- the generator ----------------------------------------------------------------------------


def _listing(*rows: dict[str, object]) -> str:
    none = {"code": 0, "name": "NONE", "retriable": False, "message": None, "exception": None}
    return "".join(json.dumps(r) + "\n" for r in (none, *rows))


def _row(code: int, name: str, message: str = "m", retriable: bool = False) -> dict[str, object]:
    return {
        "code": code,
        "name": name,
        "retriable": retriable,
        "message": message,
        "exception": "SomeException",
    }


def _load(source: str) -> ModuleType:
    module = ModuleType("kcore.errors._generated_for_test")
    module.__package__ = "kcore.errors"
    exec(compile(source, module.__name__, "exec"), module.__dict__)
    return module


def test_generator_renders_valid_python() -> None:
    tricky = 'He said "no" \\ then\ttabbed, café; ' + "word " * 60 + "end."
    rows = generate_errors.parse_listing(
        _listing(
            _row(5, "SOME_THING", tricky, retriable=True),
            _row(-1, "UNKNOWN_SERVER_ERROR", "unknown"),
            _row(7, "OTHER_EXCEPTION"),
        )
    )
    assert [r.code for r in rows] == [-1, 5, 7]  # sorted, NONE dropped
    source = generate_errors.render(rows, "9.9.9")
    assert source == generate_errors.render(rows, "9.9.9")  # deterministic
    assert all(len(line) <= generate_errors.LINE_LENGTH for line in source.splitlines())
    ast.parse(source)
    mod = _load(source)
    assert mod.SomeThingError.default_message == tricky
    assert mod.SomeThingError.retriable is True
    assert mod.OtherError.name == "OTHER_EXCEPTION"
    assert mod.RETRIABLE_CODES == frozenset({5})
    assert set(mod.ERRORS_BY_CODE) == {-1, 5, 7}
    assert mod.error_for_code(0) is None
    assert mod.error_for_code(8).code == 8
    assert [(m.name, m.value) for m in mod.ErrorCode] == [
        ("UNKNOWN_SERVER_ERROR", -1),
        ("NONE", 0),
        ("SOME_THING", 5),
        ("OTHER_EXCEPTION", 7),
    ]
    assert sorted(mod.__all__) == sorted(
        ["UnknownServerError", "SomeThingError", "OtherError", *generate_errors.FIXED_NAMES]
    )


@pytest.mark.parametrize(
    ("rows", "complaint"),
    [
        ([_row(200, "KAFKA")], "KafkaError collides"),
        ([_row(200, "CORRUPT_RECORD")], "CorruptRecordError collides"),
        ([_row(200, "CONFIG_EXCEPTION")], "ConfigError collides"),
        ([_row(200, "TIMEOUT")], "TimeoutError collides with a name a Python builtin"),
        ([_row(1, "A_THING"), _row(1, "B_THING")], "code 1 used by both"),
        ([_row(1, "A_THING"), _row(2, "A_THING_ERROR")], "both map to class name AThingError"),
    ],
)
def test_generator_rejects_collisions(rows: list[dict[str, object]], complaint: str) -> None:
    listing = _listing(_row(-1, "UNKNOWN_SERVER_ERROR"), *rows)
    with pytest.raises(generate_errors.GeneratorError, match=re.escape(complaint)):
        generate_errors.parse_listing(listing)


def test_generator_rejects_bad_listing() -> None:
    with pytest.raises(generate_errors.GeneratorError, match="no NONE"):
        generate_errors.parse_listing(json.dumps(_row(-1, "UNKNOWN_SERVER_ERROR")) + "\n")
    with pytest.raises(generate_errors.GeneratorError, match="cannot parse"):
        generate_errors.parse_listing("not json\n")
    with pytest.raises(generate_errors.GeneratorError, match="UNKNOWN_SERVER_ERROR"):
        generate_errors.parse_listing(_listing(_row(1, "A_THING")))


@pytest.mark.slow
def test_committed_codes_are_up_to_date() -> None:
    """Runs ListKafkaErrors.java against the PROTOCOL_SOURCE_VERSION jar (fetched with Maven on
    first use) and compares with the committed file."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "generate_errors.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
