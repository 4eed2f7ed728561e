"""SCRAM users: ``describe_user_scram_credentials`` and ``alter_user_scram_credentials``, as
Java's Admin has them (KIP-554): the brokers' SCRAM logins are created, changed and removed
through the controller, with no ZooKeeper and no ``kafka-storage --add-scram``.

The client salts the password itself (PBKDF2 with the mechanism's hash, as Java's
``ScramFormatter``): the password never leaves the client."""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kcore.admin.client_part import AdminClientPart
from kcore.admin.types import AdminOperationError
from kcore.errors import (
    KafkaError,
    KcoreError,
    ResourceNotFoundError,
    UnacceptableCredentialError,
    UnknownServerError,
    UnsupportedSaslMechanismError,
    error_for_code,
)
from kcore.protocol import ApiKey
from kcore.protocol.messages.alter_user_scram_credentials_request import (
    AlterUserScramCredentialsRequest,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from kcore.protocol.messages.describe_user_scram_credentials_request import (
    DescribeUserScramCredentialsRequest,
    UserName,
)

__all__ = [
    "ScramCredentialInfo",
    "ScramMechanism",
    "ScramOperations",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "UserScramCredentialsDescription",
]

# The broker's bounds (Kafka's ScramMechanism.minIterations and maxIterations).
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384


class ScramMechanism(enum.IntEnum):
    """Java's ``org.apache.kafka.clients.admin.ScramMechanism`` (its wire codes)."""

    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @classmethod
    def of(cls, value: Any) -> ScramMechanism:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            wanted = value.strip().upper().replace("-", "_")
            if wanted in cls.__members__ and wanted != "UNKNOWN":
                return cls[wanted]
        raise KcoreError(f"unknown SCRAM mechanism {value!r} (SCRAM-SHA-256 or SCRAM-SHA-512)")


_HASHES = {ScramMechanism.SCRAM_SHA_256: "sha256", ScramMechanism.SCRAM_SHA_512: "sha512"}


@dataclass(frozen=True)
class ScramCredentialInfo:
    mechanism: ScramMechanism
    iterations: int


@dataclass(frozen=True)
class UserScramCredentialsDescription:
    """A user's SCRAM credentials: which mechanisms, with how many iterations (never the
    salted password)."""

    name: str
    credential_infos: tuple[ScramCredentialInfo, ...]


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Create or replace ``user``'s credential for ``mechanism`` (``"SCRAM-SHA-256"``,
    ``"SCRAM-SHA-512"`` or :class:`ScramMechanism`). ``iterations`` 4096 to 16384 (Java's
    default 4096); ``salt`` random unless given (tests pin it)."""

    user: str
    mechanism: Any
    password: str | bytes = field(repr=False)
    iterations: int = MIN_ITERATIONS
    salt: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    """Remove ``user``'s credential for ``mechanism``."""

    user: str
    mechanism: Any


def salted_password(mechanism: ScramMechanism, password: str | bytes, salt: bytes, n: int) -> bytes:
    """RFC 5802's SaltedPassword, Hi(password, salt, n): PBKDF2 with the mechanism's HMAC, the
    password as UTF-8 and not normalized (as Java and the brokers do)."""
    secret = password.encode() if isinstance(password, str) else password
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], secret, salt, n)


class ScramOperations(AdminClientPart):
    """Part of :class:`~kcore.admin.AsyncAdminClient` (a base class of it): SCRAM user
    administration. Requests go to any broker (it forwards alterations to the controller)."""

    async def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> dict[str, UserScramCredentialsDescription]:
        """Each user's SCRAM mechanisms and iterations (``users`` None or empty: every user
        that has some, as Java's). A user named that has none fails alone
        (``ResourceNotFoundError``) in ``AdminOperationError``, whose ``results`` holds the
        others."""
        if isinstance(users, str):
            raise KcoreError("describe_user_scram_credentials takes a list of user names")
        names = list(dict.fromkeys(users or ())) or None

        async def attempt() -> Any:
            response = await self._send_any(
                lambda version: DescribeUserScramCredentialsRequest(
                    users=None if names is None else [UserName(name=n) for n in names]
                ),
                ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            )
            err = error_for_code(response.error_code)
            if err is not None:
                raise err.with_message(
                    f"describe_user_scram_credentials: {response.error_message or err.message}"
                )
            return response

        response = await self._retrying("describe_user_scram_credentials", attempt, timeout)
        results: dict[str, UserScramCredentialsDescription] = {}
        errors: dict[str, KcoreError] = {}
        for r in response.results:
            err = error_for_code(r.error_code)
            if err is not None:
                errors[r.user] = err.with_message(f"{r.user}: {r.error_message or err.message}")
                continue
            infos = tuple(
                ScramCredentialInfo(_mechanism(c.mechanism), c.iterations)
                for c in r.credential_infos
            )
            results[r.user] = UserScramCredentialsDescription(r.user, infos)
        for name in names or ():
            if name not in results and name not in errors:
                errors[name] = _no_result(name)
        if errors:
            raise AdminOperationError("describe_user_scram_credentials", errors, results)
        return results

    async def alter_user_scram_credentials(
        self,
        alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
        *,
        timeout: float | None = None,
    ) -> None:
        """Apply the upsertions and deletions. Raises ``AdminOperationError`` mapping each
        user whose alterations failed to the error, as Java's: ``UnacceptableCredentialError``
        for an empty name, password or salt or iterations out of the broker's bounds (4096 to
        16384), ``UnsupportedSaslMechanismError`` for a mechanism that is not SCRAM-SHA-256 or
        -512 (those two are said without asking; their user's other alterations are not sent),
        ``ResourceNotFoundError`` deleting a credential that does not exist,
        ``DuplicateResourceError`` for two alterations of one user in one call (KRaft)."""
        by_user: dict[str, list[Any]] = {}
        errors: dict[str, KcoreError] = {}
        for a in alterations:
            if not isinstance(a, UserScramCredentialUpsertion | UserScramCredentialDeletion):
                raise KcoreError(
                    "alter_user_scram_credentials takes UserScramCredentialUpsertion and "
                    f"UserScramCredentialDeletion objects, not {type(a).__name__}"
                )
            try:
                item = _alteration(a)
            except KafkaError as exc:
                errors[a.user] = exc
                continue
            by_user.setdefault(a.user, []).append(item)
        for user in errors:
            by_user.pop(user, None)
        # Users sent in an attempt whose outcome is unknown (no answer, or a retriable error):
        # the controller may have applied their alterations, so on the next attempt a
        # deletion's RESOURCE_NOT_FOUND is the first attempt's success (as delete_topics
        # counts UNKNOWN_TOPIC).
        maybe_applied: set[str] = set()
        done: set[str] = set()

        async def attempt() -> None:
            todo = [u for u in by_user if u not in done and u not in errors]
            if not todo:
                return
            items = [i for u in todo for i in by_user[u]]
            try:
                response = await self._send_any(
                    lambda version: AlterUserScramCredentialsRequest(
                        deletions=[i for i in items if isinstance(i, ScramCredentialDeletion)],
                        upsertions=[i for i in items if isinstance(i, ScramCredentialUpsertion)],
                    ),
                    ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                )
            except BaseException:
                maybe_applied.update(todo)
                raise
            retry: KafkaError | None = None
            answered: set[str] = set()
            for r in response.results:
                answered.add(r.user)
                err = error_for_code(r.error_code)
                gone = isinstance(err, ResourceNotFoundError) and r.user in maybe_applied
                if err is None or gone:
                    done.add(r.user)
                    continue
                err = err.with_message(f"{r.user}: {r.error_message or err.message}")
                if err.retriable:
                    maybe_applied.add(r.user)
                    retry = err
                else:
                    errors[r.user] = err
            for user in todo:
                if user not in answered:
                    errors[user] = _no_result(user)
            if retry is not None:
                raise retry

        await self._retrying("alter_user_scram_credentials", attempt, timeout)
        if errors:
            raise AdminOperationError("alter_user_scram_credentials", errors, {})


def _alteration(a: Any) -> ScramCredentialDeletion | ScramCredentialUpsertion:
    """The request item for one alteration; the errors Java's client gives without asking."""
    if not a.user:
        raise UnacceptableCredentialError("a SCRAM credential needs a user name")
    try:
        mech = ScramMechanism.of(a.mechanism)
    except KcoreError:
        raise UnsupportedSaslMechanismError(
            f"{a.user}: unknown SCRAM mechanism {a.mechanism!r} (SCRAM-SHA-256 or -512)"
        ) from None
    if isinstance(a, UserScramCredentialDeletion):
        return ScramCredentialDeletion(name=a.user, mechanism=int(mech))
    if not a.password:
        raise UnacceptableCredentialError(f"{a.user}: the password must not be empty")
    if not MIN_ITERATIONS <= a.iterations <= MAX_ITERATIONS:
        # The broker's answer too; said here so that a huge count does not spin PBKDF2.
        raise UnacceptableCredentialError(
            f"{a.user}: iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}, not {a.iterations}"
        )
    if a.salt is not None and not a.salt:
        raise UnacceptableCredentialError(f"{a.user}: the salt must not be empty")
    salt = a.salt if a.salt is not None else secrets.token_bytes(32)
    return ScramCredentialUpsertion(
        name=a.user,
        mechanism=int(mech),
        iterations=a.iterations,
        salt=salt,
        salted_password=salted_password(mech, a.password, salt, a.iterations),
    )


def _no_result(user: str) -> KafkaError:
    return UnknownServerError(f"{user}: the broker's answer had no result for this user")


def _mechanism(code: int) -> ScramMechanism:
    try:
        return ScramMechanism(code)
    except ValueError:
        return ScramMechanism.UNKNOWN
