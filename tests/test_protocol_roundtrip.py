"""Generated protocol messages: round trips for every class and version, hand-derived byte
vectors, version checks, tagged fields and malformed input. No broker needed."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest

from kcore.errors import KcoreError, ProtocolError, TruncatedDataError, UnsupportedVersionError
from kcore.protocol import messages
from kcore.protocol.types import MAX_VERSION, FieldInfo, Message

ALL_CLASSES = [messages.message_class(name) for name in sorted(messages.MESSAGES)]
PAIRS = [
    (cls, v)
    for cls in ALL_CLASSES
    if cls.VALID_VERSIONS is not None
    for v in range(cls.VALID_VERSIONS[0], cls.VALID_VERSIONS[1] + 1)
]


def pair_id(pair: tuple[type[Message], int]) -> str:
    return f"{pair[0].NAME}-v{pair[1]}"


# ---------------------------------------------------------------------------------------------
# Building instances with a non-default value in every field a version has


def in_range(version: int, span: tuple[int, int] | None) -> bool:
    return span is not None and span[0] <= version <= span[1]


def struct_class(owner: type[Message], type_name: str) -> type[Message]:
    return getattr(sys.modules[owner.__module__], type_name.removeprefix("[]"))


SAMPLES: dict[str, list[Any]] = {
    "int8": [42, -7],
    "int16": [-1234, 4321],
    "uint16": [65000, 1],
    "int32": [-123456, 7654321],
    "uint32": [4_000_000_000, 3],
    "int64": [-(2**40) - 5, 2**62 + 11],
    "float64": [1.5, -0.25],
    "string": ["kcore-h\u00e9llo-\u2713", "x"],
    "bytes": [b"\x00\x01\xffbytes", b""],
    "records": [b"\x00\x00\x00\x00records-bytes", b"r"],
    "uuid": [uuid.UUID("7b4f1c8e-9a3d-4e2f-8b6a-0c1d2e3f4a5b"), uuid.UUID(int=1)],
}


def sample(f: FieldInfo, default: Any, seed: int) -> Any:
    if f.type == "bool":
        return not default
    options = SAMPLES[f.type]
    value = options[seed % len(options)]
    if value == default:
        value = options[(seed + 1) % len(options)]
    return value


def build(cls: type[Message], version: int, nulls: bool, seed: int = 0) -> Message:
    """An instance whose every field present at ``version`` differs from its default (or is
    null, when ``nulls`` and the field is nullable at ``version``)."""
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for i, f in enumerate(cls.FIELDS):
        if not in_range(version, f.versions):
            continue
        if nulls and in_range(version, f.nullable_versions):
            kwargs[f.attr] = None
            continue
        default = getattr(defaults, f.attr)
        elem = f.type.removeprefix("[]")
        if elem[0].isupper():
            sub = struct_class(cls, elem)
            if f.type.startswith("[]"):
                kwargs[f.attr] = [build(sub, version, nulls, seed + i + k) for k in range(2)]
            else:
                kwargs[f.attr] = build(sub, version, nulls, seed + i)
        elif f.type.startswith("[]"):
            if elem == "bool":
                kwargs[f.attr] = [True, False]
            else:
                kwargs[f.attr] = [SAMPLES[elem][0], SAMPLES[elem][1], SAMPLES[elem][0]]
        else:
            kwargs[f.attr] = sample(f, default, seed + i)
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_round_trip(pair: tuple[type[Message], int]) -> None:
    cls, version = pair
    for nulls in (False, True):
        obj = build(cls, version, nulls)
        data = obj.encode(version)
        decoded, end = cls.decode(data, version)
        assert end == len(data)
        assert decoded == obj, f"{cls.NAME} v{version} nulls={nulls}"
        # Byte-identical re-encoding, also from memoryview / bytearray input at an offset.
        assert decoded.encode(version) == data
        padded = b"\xaa" * 3 + data + b"\xbb"
        for buf in (memoryview(padded), bytearray(padded)):
            again, end = cls.decode(buf, version, 3)
            assert end == 3 + len(data)
            assert again == obj
        # encode_into appends.
        out = bytearray(b"prefix")
        obj.encode_into(out, version)
        assert out == b"prefix" + data


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_truncated_input_raises_kcore_error(pair: tuple[type[Message], int]) -> None:
    cls, version = pair
    data = build(cls, version, False).encode(version)
    cuts = range(len(data)) if len(data) <= 300 else range(0, len(data), len(data) // 150)
    for cut in cuts:
        with pytest.raises(KcoreError):
            cls.decode(data[:cut], version)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_fields_missing_from_a_version(pair: tuple[type[Message], int]) -> None:
    """A non-default value in a field the version lacks: UnsupportedVersionError, unless the
    field is ignorable (then it is dropped silently), like the Java client."""
    cls, version = pair
    full = build_everywhere(cls)
    for f in cls.FIELDS:
        if in_range(version, f.versions):
            continue
        obj = cls(**{f.attr: getattr(full, f.attr)})
        if f.ignorable:
            data = obj.encode(version)
            assert cls.decode(data, version)[0] == cls()
        else:
            with pytest.raises(UnsupportedVersionError, match=f.attr):
                obj.encode(version)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.NAME)
def test_nested_fields_missing_from_a_version(cls: type[Message]) -> None:
    """The same rule inside nested structs, checked through the whole message."""
    nested = [v for v in vars(cls).values() if isinstance(v, type) and issubclass(v, Message)]
    for sub in nested:
        lo, hi = sub.VALID_VERSIONS or (0, -1)
        for version in range(lo, hi + 1):
            for f in sub.FIELDS:
                if in_range(version, f.versions) or f.ignorable:
                    continue
                obj = sub(**{f.attr: getattr(build_everywhere(sub), f.attr)})
                with pytest.raises(UnsupportedVersionError, match=f.attr):
                    obj.encode(version)


def build_everywhere(cls: type[Message]) -> Message:
    """Non-default values for every field, whatever its versions."""
    values = {}
    for f in cls.FIELDS:
        span = f.versions or (0, 0)
        inside = build(cls, span[0], False)
        values[f.attr] = getattr(inside, f.attr)
    return cls(**values)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.NAME)
def test_versions_outside_the_valid_range(cls: type[Message]) -> None:
    bad = (
        [-1, MAX_VERSION]
        if cls.VALID_VERSIONS is None
        else [cls.VALID_VERSIONS[0] - 1, cls.VALID_VERSIONS[1] + 1]
    )
    for version in bad:
        with pytest.raises(UnsupportedVersionError):
            cls().encode(version)
        with pytest.raises(UnsupportedVersionError):
            cls.decode(b"\x00" * 64, version)


def test_every_class_has_the_documented_attributes() -> None:
    for cls in ALL_CLASSES:
        assert isinstance(cls.NAME, str) and cls.NAME == cls.__name__
        assert cls.VALID_VERSIONS is None or cls.VALID_VERSIONS[0] <= cls.VALID_VERSIONS[1]
        assert cls.FLEXIBLE_VERSIONS is None or isinstance(cls.FLEXIBLE_VERSIONS, int)
        assert "__dict__" not in dir(cls())  # __slots__ all the way down
        assert cls() == cls()
        with pytest.raises(TypeError):
            hash(cls())


def test_pair_count() -> None:
    # 4.3.1: 198 definitions (93 APIs), 625 (class, version) pairs with a valid version.
    assert len(ALL_CLASSES) == len(messages.MESSAGES) >= 198
    assert len(PAIRS) >= 600


# ---------------------------------------------------------------------------------------------
# Byte vectors derived by hand from the protocol guide


def test_api_versions_request_v3_bytes() -> None:
    req = messages.ApiVersionsRequest(client_software_name="kcore", client_software_version="1.0")
    # COMPACT_STRING = uvarint(len + 1) + utf-8; then an empty tagged-field section (0x00).
    expected = b"\x06kcore" + b"\x041.0" + b"\x00"
    assert req.encode(3) == expected
    assert messages.ApiVersionsRequest.decode(expected, 3) == (req, len(expected))
    # v0-v2 have no fields at all; the two ignorable strings are dropped.
    assert req.encode(0) == b""


def test_metadata_request_v0_bytes() -> None:
    topic = messages.MetadataRequest.MetadataRequestTopic
    req = messages.MetadataRequest(topics=[topic(name="ab"), topic(name="c")])
    # ARRAY = int32 count; STRING = int16 length + bytes. v0 has no other field.
    expected = b"\x00\x00\x00\x02" + b"\x00\x02ab" + b"\x00\x01c"
    assert req.encode(0) == expected
    assert messages.MetadataRequest.decode(expected, 0)[0] == req


def test_metadata_request_v12_bytes() -> None:
    topic = messages.MetadataRequest.MetadataRequestTopic
    tid = uuid.UUID(bytes=bytes(range(16)))
    req = messages.MetadataRequest(
        topics=[topic(topic_id=tid, name=None)],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    expected = (
        b"\x02"  # COMPACT_ARRAY: 1 element + 1
        + bytes(range(16))  # TopicId
        + b"\x00"  # Name: COMPACT_NULLABLE_STRING null
        + b"\x00"  # the topic's tagged fields
        + b"\x00"  # AllowAutoTopicCreation false
        + b"\x01"  # IncludeTopicAuthorizedOperations true (ClusterAuthorizedOperations: v8-10)
        + b"\x00"  # tagged fields
    )
    assert req.encode(12) == expected
    assert messages.MetadataRequest.decode(expected, 12)[0] == req
    # Null topics = all topics (v1+): int32 -1 in v1, compact 0 in v9+.
    assert messages.MetadataRequest(topics=None).encode(1) == b"\xff\xff\xff\xff"
    # Then AllowAutoTopicCreation (default true), IncludeTopicAuthorizedOperations, tags.
    assert messages.MetadataRequest(topics=None).encode(12) == b"\x00\x01\x00\x00"


def test_request_header_v2_client_id_is_never_compact() -> None:
    hdr = messages.RequestHeader(
        request_api_key=18, request_api_version=3, correlation_id=7, client_id="ab"
    )
    expected = b"\x00\x12" + b"\x00\x03" + b"\x00\x00\x00\x07" + b"\x00\x02ab" + b"\x00"
    assert hdr.encode(2) == expected
    assert hdr.encode(1) == expected[:-1]
    assert messages.RequestHeader(client_id=None).encode(1) == b"\x00" * 8 + b"\xff\xff"


def test_api_versions_response_v3_tagged_fields() -> None:
    resp = messages.ApiVersionsResponse(
        error_code=0,
        api_keys=[
            messages.ApiVersionsResponse.ApiVersion(api_key=3, min_version=0, max_version=13)
        ],
        throttle_time_ms=0,
        finalized_features_epoch=5,
    )
    expected = (
        b"\x00\x00"  # ErrorCode
        + b"\x02"
        + b"\x00\x03\x00\x00\x00\x0d"
        + b"\x00"  # ApiKeys, one element + its tags
        + b"\x00\x00\x00\x00"  # ThrottleTimeMs
        + b"\x01"  # one tagged field
        + b"\x01\x08"
        + (5).to_bytes(8, "big")  # tag 1 FinalizedFeaturesEpoch, 8 bytes
    )
    assert resp.encode(3) == expected
    decoded = messages.ApiVersionsResponse.decode(expected, 3)[0]
    assert decoded.finalized_features_epoch == 5
    assert decoded.supported_features == [] and decoded.zk_migration_ready is False
    # The same value at its default is not written at all.
    resp.finalized_features_epoch = -1
    assert resp.encode(3)[-1:] == b"\x00"


def test_nullable_struct_presence_byte() -> None:
    # KIP-893: a nullable (non-tagged) struct is preceded by int8 -1 (null) or 1 (present).
    cls = messages.ConsumerGroupHeartbeatResponse
    null = cls(assignment=None).encode(0)
    present = cls(assignment=cls.Assignment()).encode(0)
    assert len(present) > len(null)
    prefix = len(null) - 2  # the marker and the empty tagged-field section end the message
    assert null[prefix:] == b"\xff\x00"
    assert present[prefix] == 1
    assert cls.decode(null, 0)[0].assignment is None
    assert cls.decode(present, 0)[0].assignment == cls.Assignment()


def test_uint_and_float_types() -> None:
    cls = messages.AlterClientQuotasRequest
    op = cls.OpData(key="k", value=2.5, remove=True)
    data = op.encode(1)
    assert data == b"\x02k" + b"\x40\x04\x00\x00\x00\x00\x00\x00" + b"\x01" + b"\x00"
    listener = messages.BrokerRegistrationRequest.Listener(name="n", host="h", port=65535)
    assert b"\xff\xff" in listener.encode(0)
    assert messages.BrokerRegistrationRequest.Listener.decode(listener.encode(0), 0)[0] == listener


# ---------------------------------------------------------------------------------------------
# Tagged fields that this version of kcore does not know


def test_unknown_tagged_fields_are_preserved() -> None:
    cls = messages.ApiVersionsResponse
    known = cls(finalized_features_epoch=9).encode(3)
    assert known[-11:-10] == b"\x01"  # one tagged field
    body = known[:-11]
    # Tags 1 (known), 4 and 9 (unknown), in tag order as the protocol requires.
    tagged = b"\x03" + b"\x01\x08" + (9).to_bytes(8, "big") + b"\x04\x02hi" + b"\x09\x00"
    data = body + tagged
    obj, end = cls.decode(data, 3)
    assert end == len(data)
    assert obj.finalized_features_epoch == 9
    assert obj._unknown_tagged_fields == [(4, b"hi"), (9, b"")]
    assert obj.encode(3) == data
    assert obj != cls(finalized_features_epoch=9)


def test_unknown_tagged_fields_on_struct_without_known_tags() -> None:
    cls = messages.MetadataRequest
    data = cls(topics=[]).encode(12)
    assert data.endswith(b"\x00")
    with_tags = data[:-1] + b"\x02" + b"\x00\x01z" + b"\x05\x03abc"
    obj = cls.decode(with_tags, 12)[0]
    assert obj._unknown_tagged_fields == [(0, b"z"), (5, b"abc")]
    assert obj.encode(12) == with_tags


def test_known_tag_with_a_wrong_size_is_rejected() -> None:
    cls = messages.ApiVersionsResponse
    data = cls(finalized_features_epoch=9).encode(3)
    assert data[-10:-8] == b"\x01\x08"  # tag 1, size 8
    bad = data[:-9] + b"\x09" + data[-8:] + b"\x00"  # declares 9 bytes for an int64
    with pytest.raises(ProtocolError):
        cls.decode(bad, 3)


# ---------------------------------------------------------------------------------------------
# Values and errors


def test_records_decode_zero_copy() -> None:
    cls = messages.FetchResponse
    part = cls.PartitionData(partition_index=1, records=b"RECORDS")
    resp = cls(responses=[cls.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=[part])])
    data = resp.encode(17)
    decoded = cls.decode(data, 17)[0]
    records = decoded.responses[0].partitions[0].records
    assert isinstance(records, memoryview) and records.obj is data
    assert records == b"RECORDS"
    view = memoryview(bytearray(data))
    records = cls.decode(view, 17)[0].responses[0].partitions[0].records
    assert records.obj is view.obj
    # Null records.
    part.records = None
    assert cls.decode(resp.encode(17), 17)[0].responses[0].partitions[0].records is None


def test_bytes_decode_as_bytes_and_strings_as_str() -> None:
    cls = messages.SaslAuthenticateResponse
    obj = cls(error_message="\u00fcber", auth_bytes=b"\x00\x01")
    for version in (0, 2):
        decoded = cls.decode(memoryview(obj.encode(version)), version)[0]
        assert type(decoded.auth_bytes) is bytes and decoded.auth_bytes == b"\x00\x01"
        assert type(decoded.error_message) is str and decoded.error_message == "\u00fcber"


def test_defaults() -> None:
    req = messages.FetchRequest()
    assert req.replica_id == -1  # "-1"
    assert req.max_bytes == 0x7FFFFFFF  # "0x7fffffff"
    assert req.isolation_level == 0
    assert req.cluster_id is None  # "null"
    assert req.replica_state == messages.FetchRequest.ReplicaState()
    assert req.topics == [] and req.topics is not messages.FetchRequest().topics
    assert messages.MetadataRequest().allow_auto_topic_creation is True  # "true"
    assert messages.MetadataRequest.MetadataRequestTopic().topic_id == uuid.UUID(int=0)


def test_null_in_a_non_nullable_field() -> None:
    with pytest.raises(ValueError):
        messages.MetadataRequest(topics=None).encode(0)  # nullable from v1 only
    with pytest.raises(ValueError):
        messages.ApiVersionsRequest(client_software_name=None).encode(3)
    data = b"\xff\xff\xff\xff"  # a null array where v0 does not allow one
    with pytest.raises(KcoreError):
        messages.MetadataRequest.decode(data, 0)


def test_encode_errors_leave_the_buffer_unchanged() -> None:
    out = bytearray(b"keep")
    with pytest.raises(ValueError):
        messages.ProduceRequest(acks=1 << 20).encode_into(out, 9)  # int16 overflow
    assert out == b"keep"


def test_malformed_input_never_leaks_low_level_errors() -> None:
    cls = messages.MetadataResponse
    data = build(cls, 12, False).encode(12)
    # Invalid UTF-8 in a string, a huge array count, a varint that never ends.
    bad_inputs = [
        data[:4] + b"\x02" + b"\x00\x00\x00\x01" + b"\x03\xff\xfe" + data[11:],
        data[:4] + b"\xff\xff\xff\xff\x0f",
        data[:4] + b"\xff" * 12,
    ]
    for bad in bad_inputs:
        with pytest.raises(KcoreError):
            cls.decode(bad, 12)
    with pytest.raises(TruncatedDataError):
        cls.decode(b"", 12)


def test_repr_names_the_fields() -> None:
    r = repr(messages.MetadataRequest(topics=None))
    assert r.startswith("MetadataRequest(topics=None, allow_auto_topic_creation=True")


# ---------------------------------------------------------------------------------------------
# The registry


def test_registry() -> None:
    assert messages.API_KEYS["Produce"] == 0
    assert messages.API_KEYS["Metadata"] == 3
    assert messages.API_KEYS["ApiVersions"] == 18
    info = messages.APIS[3]
    assert (info.name, info.request, info.response) == (
        "Metadata",
        "MetadataRequest",
        "MetadataResponse",
    )
    assert info.valid_versions == (0, 13) and info.flexible_versions == 9
    assert messages.request_class(3) is messages.MetadataRequest
    assert messages.response_class(1).NAME == "FetchResponse"
    assert messages.request_class(1).API_KEY == 1
    assert messages.APIS[7].valid_versions is None  # ControlledShutdown: removed in Kafka 4.0
    assert messages.APIS[22].latest_version_unstable
    assert messages.APIS[22].max_stable_version == messages.APIS[22].valid_versions[1] - 1
    with pytest.raises(KeyError):
        messages.request_class(9999)
    with pytest.raises(AttributeError):
        messages.NoSuchMessage  # noqa: B018
    for key, info in messages.APIS.items():
        assert messages.request_class(key).API_KEY == key
        assert messages.response_class(key).VALID_VERSIONS == info.valid_versions


def test_importing_kcore_protocol_is_lazy() -> None:
    code = (
        "import sys, kcore.protocol\n"
        "loaded = [m for m in sys.modules if m.startswith('kcore.protocol.messages.')]\n"
        "print(' '.join(sorted(loaded)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    from kcore.protocol._decoders import DECODERS

    # The response header (for framing) and the classes the compiled decoders build, nothing
    # else.
    expected = {"kcore.protocol.messages.response_header"} | {c.__module__ for c in DECODERS}
    assert set(out.stdout.split()) == expected
