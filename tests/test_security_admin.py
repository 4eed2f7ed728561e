"""Security administration against a real broker with KRaft's StandardAuthorizer:

* ACLs (create_acls, describe_acls, delete_acls, ``kcore acls``): the ACLs kcore creates are the
  ones the broker enforces on another user's clients, filters select as Java's do, and a broker
  without an authorizer says so;
* SCRAM users (alter/describe_user_scram_credentials, KIP-554): a user kcore creates logs in, a
  changed password replaces the old one, a deleted user is refused."""

from __future__ import annotations

import json
import time
import uuid

import pytest

import kcore
from kcore.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AdminClient,
    AdminOperationError,
    NewTopic,
    PatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kcore.errors import (
    ClusterAuthorizationFailedError,
    DuplicateResourceError,
    KcoreError,
    ResourceNotFoundError,
    SaslAuthenticationFailedError,
    SecurityDisabledError,
    TopicAuthorizationFailedError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from kcore.testing import KafkaCluster
from kcore.testing.security import SASL_PLAINTEXT_LISTENER, sasl_listener

BOB = ("bob", "bob-secret")


@pytest.fixture(scope="module")
def secured():
    """The PLAINTEXT listeners (controller, inter-broker and the admin's) are User:ANONYMOUS,
    a super user; bob logs in over SASL and has only the ACLs a test gives him."""
    listener = sasl_listener(
        name=SASL_PLAINTEXT_LISTENER,
        mechanisms=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
        users={BOB[0]: BOB[1]},
    )
    config = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }
    with KafkaCluster(listeners=[listener], broker_config=config) as cluster:
        yield cluster


def bob_config(cluster) -> dict:
    return {
        "bootstrap.servers": cluster.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": BOB[0],
        "sasl.password": BOB[1],
    }


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_acls_created_are_enforced_described_and_deleted(secured):
    topic = name("acl")
    read = AclBinding("topic", topic, "literal", "User:bob", "*", "read", "allow")
    write = AclBinding(
        ResourceType.TOPIC,
        topic,
        PatternType.LITERAL,
        "User:bob",
        "*",
        AclOperation.WRITE,
        "ALLOW",
    )
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
        # No ACL: bob's idempotent producer may not even get a producer id (KIP-679: that
        # takes IDEMPOTENT_WRITE on the cluster, or WRITE on some topic); it says so at once
        # (the constructor returns at once; what waits for the producer id raises it).
        with kcore.Producer({**bob_config(secured), "max.block.ms": 5000}) as p:
            with pytest.raises(ClusterAuthorizationFailedError, match="IDEMPOTENT_WRITE"):
                p.wait_until_ready()
        plain = {**bob_config(secured), "enable.idempotence": False, "max.block.ms": 5000}
        with kcore.Producer(plain) as p:
            with pytest.raises(TopicAuthorizationFailedError):
                p.send(topic, b"denied").result(30)
        admin.create_acls([read, write])
        admin.create_acls([read])  # an ACL that exists already is not an error
        mine = AclBindingFilter(resource_type="topic", name=topic)
        # A describe is answered from the broker's authorizer, which applies the controller's
        # changes moments later (read-after-write is not promised, in Java's client either).
        wait_for(lambda: set(admin.describe_acls(mine)) == {read, write}, 30, "the ACLs")
        assert admin.describe_acls(AclBindingFilter.of(read)) == [read]
        assert read in admin.describe_acls()  # every ACL
        # The broker enforces them: bob writes and reads (the authorizer applies ACLs as the
        # metadata log reaches it, moments after the create).
        wait_for(lambda: _sent(bob_config(secured), topic), 30, "bob's write to be allowed")
        with kcore.Consumer({**bob_config(secured), "auto.offset.reset": "earliest"}) as c:
            c.assign([(topic, 0)])
            got = wait_for(lambda: c.poll(0.5), 30, "bob's read")
            assert got[0].value == b"allowed"
        deleted = admin.delete_acls([AclBindingFilter.of(write)])
        assert deleted == {AclBindingFilter.of(write): [write]}
        wait_for(lambda: admin.describe_acls(mine) == [read], 30, "the deletion")
        wait_for(lambda: _denied(bob_config(secured), topic), 30, "bob's write to be denied")
        # A filter that matches nothing deletes nothing.
        nothing = AclBindingFilter(resource_type="topic", name=name("none"))
        assert admin.delete_acls([nothing]) == {nothing: []}
        admin.delete_acls([mine])
        wait_for(lambda: admin.describe_acls(mine) == [], 30, "the last deletion")


DENIED = (TopicAuthorizationFailedError, ClusterAuthorizationFailedError)


def _sent(config: dict, topic: str) -> bool:
    """A new producer each time: a denied producer id is fatal to the producer, as Java's."""
    try:
        with kcore.Producer({**config, "max.block.ms": 10000}) as producer:
            producer.send(topic, b"allowed").result(10)
            return True
    except DENIED:
        return False


def _denied(config: dict, topic: str) -> bool:
    return not _sent(config, topic)


def test_prefixed_acls_and_match_filters(secured):
    prefix = name("team") + "."
    prefixed = AclBinding("group", prefix, "prefixed", "User:bob", "*", "read", "allow")
    wildcard = AclBinding("group", "*", "literal", "User:carol", "*", "describe", "deny")
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers}) as admin:
        admin.create_acls([prefixed, wildcard])
        try:
            # MATCH: every ACL that applies to the name: the prefix and the wildcard.
            group = prefix + "etl"
            match = AclBindingFilter("group", group, "match")
            wait_for(
                lambda: {prefixed, wildcard} <= set(admin.describe_acls(match)), 30, "the ACLs"
            )
            # ANY pattern with an exact name: only bindings whose name is that string.
            assert admin.describe_acls(AclBindingFilter("group", group, "any")) == []
            only_bob = AclBindingFilter("group", None, "any", "User:bob")
            assert prefixed in admin.describe_acls(only_bob)
            assert wildcard not in admin.describe_acls(only_bob)
        finally:
            admin.delete_acls([AclBindingFilter.of(prefixed), AclBindingFilter.of(wildcard)])


def test_bad_bindings_are_refused_before_asking(secured):
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers}) as admin:
        vague = AclBinding("any", "t", "match", "User:bob", "*", "read", "allow")
        with pytest.raises(KcoreError, match="resource_type, pattern_type"):
            admin.create_acls([vague])
        with pytest.raises(KcoreError, match="operation: unknown AclOperation 'reed'"):
            AclBinding("topic", "t", "literal", "User:bob", "*", "reed", "allow")
        # The broker refuses a principal that is not TYPE:name, for that binding only.
        bad = AclBinding("topic", name("t"), "literal", "bob", "*", "read", "allow")
        with pytest.raises(AdminOperationError) as info:
            admin.create_acls([bad])
        assert list(info.value.errors) == [bad]


def test_a_broker_without_an_authorizer_says_so(kafka_cluster):
    with AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
        with pytest.raises(SecurityDisabledError):
            admin.describe_acls()
        binding = AclBinding("topic", "t", "literal", "User:bob", "*", "read", "allow")
        with pytest.raises(AdminOperationError) as info:
            admin.create_acls([binding])
        assert isinstance(info.value.errors[binding], SecurityDisabledError)


def test_kcore_acls_cli(secured, capsys):
    from kcore.cli import main

    topic = name("cli")
    boot = ["-b", secured.bootstrap_servers]
    add = ["acls", "add", *boot, "--topic", topic, "--allow-principal", "User:bob"]
    # kafka-acls' operation names (IdempotentWrite) and Java's (READ) both work.
    assert main([*add, "--operation", "read", "--operation", "DescribeConfigs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"ALLOW User:bob READ from * on TOPIC LITERAL {topic!r}",
        f"ALLOW User:bob DESCRIBE_CONFIGS from * on TOPIC LITERAL {topic!r}",
    ]

    def listed(*extra: str) -> list:
        assert main(["acls", *boot, "--topic", topic, "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    wait_for(lambda: len(listed()) == 2, 30, "both ACLs listed")
    assert sorted(a["operation"] for a in listed()) == ["DESCRIBE_CONFIGS", "READ"]
    assert {a["principal"] for a in listed()} == {"User:bob"}
    # A PREFIXED ACL of the same name is not a literal one: list and remove leave it alone
    # unless --pattern names it (kafka-acls' default is literal too).
    assert main([*add, "--pattern", "prefixed"]) == 0  # operation ALL by default
    assert "ALL from * on TOPIC PREFIXED" in capsys.readouterr().out
    assert main(["acls", "remove", *boot, "--topic", topic, "--operation", "READ"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"ALLOW User:bob READ from * on TOPIC LITERAL {topic!r}"
    ]
    wait_for(lambda: [a["operation"] for a in listed()] == ["DESCRIBE_CONFIGS"], 30, "removal")
    assert [a["operation"] for a in listed("--pattern", "prefixed")] == ["ALL"]
    # Refused, with a reason: a remove that would match every ACL, an add without principal.
    assert main(["acls", "remove", *boot]) == 1
    assert "needs a resource" in capsys.readouterr().err
    assert main(["acls", "add", *boot, "--topic", topic]) == 1
    assert "--allow-principal" in capsys.readouterr().err
    assert main(["acls", "remove", *boot, "--topic", topic, "--pattern", "any"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_kcore_metadata_names_a_topic_the_user_may_not_describe(secured, tmp_path, capsys):
    """bob, with no ACL on the topic, is told so (kcat: "Topic authorization failed"), not that
    the topic does not exist; his settings come from a properties file with a multi-line JAAS
    entry, as a client.properties has them."""
    from kcore.cli import main

    topic = name("hidden")
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    props = tmp_path / "bob.properties"
    props.write_text(
        f"bootstrap.servers={bob_config(secured)['bootstrap.servers']}\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        f'    username="{BOB[0]}" \\\n'
        f'    password="{BOB[1]}";\n'
    )
    assert main(["metadata", "-F", str(props), "-t", topic]) == 1
    err = capsys.readouterr().err
    assert f"{topic}: topic authorization failed" in err, err


def test_names_and_codes():
    assert AclBinding("topic", "t", "Literal", "User:a", "*", "IdempotentWrite", "Allow") == (
        AclBinding(
            ResourceType.TOPIC,
            "t",
            PatternType.LITERAL,
            "User:a",
            "*",
            AclOperation.IDEMPOTENT_WRITE,
            3,
        )
    )
    with pytest.raises(KcoreError, match="may not be UNKNOWN"):
        AclBindingFilter(operation="unknown")._check_known()
    # An operation code a newer broker might send is UNKNOWN, not an error.
    from kcore.admin.acls import _code

    assert _code(AclOperation, 99) is AclOperation.UNKNOWN


# -- SCRAM users ----------------------------------------------------------------------------------


def logs_in(cluster, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> bool | None:
    """True or False as the broker says; None if it could not be asked (a slow bootstrap on a
    loaded machine), so that a wait for either answer asks again."""
    config = {
        "bootstrap.servers": cluster.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "default.api.timeout.ms": 10000,
        "request.timeout.ms": 10000,
    }
    try:
        with AdminClient(config) as admin:  # bootstraps (logs in) here
            admin.list_topics()
        return True
    except SaslAuthenticationFailedError:
        return False
    except KcoreError:
        return None


def test_scram_users_are_created_changed_and_removed(secured):
    user = name("dave")
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers}) as admin:
        first = UserScramCredentialUpsertion(user, "SCRAM-SHA-256", "first-pw", iterations=8192)
        second = UserScramCredentialUpsertion(user, ScramMechanism.SCRAM_SHA_512, "first-pw")
        # KRaft's controller takes one alteration per user in a request (as for Java's).
        with pytest.raises(AdminOperationError) as info:
            admin.alter_user_scram_credentials([first, second])
        assert isinstance(info.value.errors[user], DuplicateResourceError)
        admin.alter_user_scram_credentials([first])
        admin.alter_user_scram_credentials([second])
        expected = {
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
        }
        # A describe is answered from the broker's metadata image, moments behind.
        wait_for(lambda: _infos(admin, user) == expected, 30, "both credentials described")
        # The brokers learn credentials from the metadata log, moments after the controller.
        wait_for(lambda: logs_in(secured, user, "first-pw") is True, 30, "the new user's login")
        assert logs_in(secured, user, "first-pw", "SCRAM-SHA-512") is True
        assert logs_in(secured, user, "wrong-pw") is False
        # A new password replaces the old one.
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, "scram-sha-256", "second-pw")]
        )
        wait_for(lambda: logs_in(secured, user, "second-pw") is True, 30, "the new password")
        assert logs_in(secured, user, "first-pw") is False
        everyone = admin.describe_user_scram_credentials()
        assert user in everyone and BOB[0] in everyone  # bob's came with the cluster's format
        admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, "SCRAM-SHA-256")])
        admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, "SCRAM-SHA-512")])
        wait_for(lambda: logs_in(secured, user, "second-pw") is False, 30, "the removal")
        wait_for(lambda: _infos(admin, user) is None, 30, "the user's removal described")
        with pytest.raises(AdminOperationError) as info:
            admin.describe_user_scram_credentials([user, BOB[0]])
        assert isinstance(info.value.errors[user], ResourceNotFoundError)
        assert BOB[0] in info.value.results
        # Deleting what is not there fails for that user, named.
        with pytest.raises(AdminOperationError) as info:
            admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, "SCRAM-SHA-256")])
        assert isinstance(info.value.errors[user], ResourceNotFoundError)


def _infos(admin, user: str):
    """The user's credentials as described, or None if it has none."""
    try:
        return set(admin.describe_user_scram_credentials([user])[user].credential_infos)
    except AdminOperationError as exc:
        if isinstance(exc.errors.get(user), ResourceNotFoundError):
            return None
        raise


def test_bad_scram_alterations_fail_per_user_as_javas(secured):
    """What Java's client refuses without asking fails that user alone; the others are
    applied."""
    good = name("erin")
    with AdminClient({"bootstrap.servers": secured.bootstrap_servers}) as admin:
        with pytest.raises(AdminOperationError) as info:
            admin.alter_user_scram_credentials(
                [
                    UserScramCredentialUpsertion("few", "SCRAM-SHA-256", "pw", iterations=100),
                    UserScramCredentialDeletion("plain", "PLAIN"),
                    UserScramCredentialUpsertion("", "SCRAM-SHA-256", "pw"),
                    UserScramCredentialUpsertion(good, "SCRAM-SHA-256", "pw"),
                ]
            )
        errors = info.value.errors
        assert isinstance(errors["few"], UnacceptableCredentialError)
        assert "4096 to 16384" in str(errors["few"])
        assert isinstance(errors["plain"], UnsupportedSaslMechanismError)
        assert isinstance(errors[""], UnacceptableCredentialError)
        assert good not in errors
        wait_for(lambda: _infos(admin, good) is not None, 30, "the good user applied")
        with pytest.raises(KcoreError, match="list of user names"):
            admin.describe_user_scram_credentials(good)


def test_salted_password_is_rfc_5802s():
    """RFC 7677's exchange: the proof computed from the salted password kcore would store is
    the one the RFC's client sends."""
    import base64
    import hashlib
    import hmac

    from kcore.admin.scram import salted_password

    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    salted = salted_password(ScramMechanism.SCRAM_SHA_256, "pencil", salt, 4096)
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth = (
        f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
        f"c=biws,r={nonce}"
    ).encode()
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    assert base64.b64encode(proof) == b"dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
