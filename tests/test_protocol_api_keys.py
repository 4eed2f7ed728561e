"""``kcore.protocol.ApiKey``: the generated enum of API keys agrees with the registry (``APIS``,
``API_KEYS``) and spells its names as Java's ``ApiKeys`` does."""

from __future__ import annotations

import enum
import sys
from pathlib import Path

import pytest

import kcore.protocol as protocol
from kcore.protocol import API_KEYS, APIS, ApiKey

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import generate_protocol  # noqa: E402


def test_one_member_per_api() -> None:
    assert issubclass(ApiKey, enum.IntEnum)
    assert len(ApiKey) == len(APIS)  # no aliases
    assert {m.value for m in ApiKey} == set(APIS)


@pytest.mark.parametrize("member", list(ApiKey), ids=lambda m: m.name)
def test_member_matches_the_registry(member: ApiKey) -> None:
    info = APIS[member]
    assert info.api_key == member
    assert API_KEYS[info.name] == member
    assert member.name == generate_protocol.api_key_name(info.name)
    assert ApiKey[member.name] is member


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("PRODUCE", 0),
        ("FETCH", 1),
        ("LIST_OFFSETS", 2),
        ("METADATA", 3),
        ("FIND_COORDINATOR", 10),
        ("SASL_HANDSHAKE", 17),
        ("API_VERSIONS", 18),
        ("OFFSET_FOR_LEADER_EPOCH", 23),
        ("ADD_PARTITIONS_TO_TXN", 24),
        ("DESCRIBE_USER_SCRAM_CREDENTIALS", 50),
        ("CONSUMER_GROUP_HEARTBEAT", 68),
        ("CONSUMER_GROUP_DESCRIBE", 69),
    ],
)
def test_java_names(name: str, key: int) -> None:
    assert ApiKey[name] == key


def test_api_key_name() -> None:
    f = generate_protocol.api_key_name
    assert f("ApiVersions") == "API_VERSIONS"
    assert f("OffsetForLeaderEpoch") == "OFFSET_FOR_LEADER_EPOCH"
    assert f("Vote") == "VOTE"


def test_exported() -> None:
    assert "ApiKey" in protocol.__all__
    assert protocol.ApiKey is protocol.messages.ApiKey
    assert ApiKey.METADATA == 3 and hash(ApiKey.METADATA) == hash(3)  # usable as a dict key
