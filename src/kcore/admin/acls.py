"""ACLs: ``create_acls``, ``describe_acls`` and ``delete_acls``, as Java's Admin has them
(CreateAcls, DescribeAcls and DeleteAcls, KIP-4/KIP-290), for brokers with an authorizer
(KRaft's ``StandardAuthorizer``).

A binding is flat, as confluent-kafka's (``AclBinding(resource_type, name, pattern_type,
principal, host, operation, permission_type)``), with Java's enum names; a filter has the same
fields with ``ANY`` / ``None`` for "any". Enum values may be given as their names, in any case
(``"topic"``, ``"READ"``)."""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kcore.admin.client_part import AdminClientPart
from kcore.admin.types import AdminOperationError
from kcore.errors import KafkaError, KcoreError, UnknownServerError, error_for_code
from kcore.protocol import ApiKey
from kcore.protocol.messages.create_acls_request import AclCreation, CreateAclsRequest
from kcore.protocol.messages.delete_acls_request import DeleteAclsFilter, DeleteAclsRequest
from kcore.protocol.messages.describe_acls_request import DescribeAclsRequest

__all__ = [
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclOperations",
    "AclPermissionType",
    "PatternType",
    "ResourceType",
]

T = TypeVar("T")


class ResourceType(enum.IntEnum):
    """Java's ``ResourceType`` (its wire codes)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    """Java's ``PatternType``: a binding is LITERAL or PREFIXED; a filter may also say ANY
    (either, as given) or MATCH (every binding that applies to the name: literal, wildcard
    and prefixes)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    """Java's ``AclOperation``."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermissionType(enum.IntEnum):
    """Java's ``AclPermissionType``."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


E = Any  # an enum member, its name (any case) or its code


def _folded(name: str) -> str:
    return name.replace("_", "").casefold()


def _member(kind: type[enum.IntEnum], value: E, field: str) -> Any:
    """An enum member from itself, its code, or its name in any case, with or without
    underscores (kafka-acls takes ``IdempotentWrite`` for IDEMPOTENT_WRITE)."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        wanted = _folded(value.strip())
        for member in kind:
            if _folded(member.name) == wanted:
                return member
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return kind(value)
        except ValueError:
            pass
    names = ", ".join(m.name for m in kind)
    raise KcoreError(f"{field}: unknown {kind.__name__} {value!r} (one of {names})")


def _code(kind: type[enum.IntEnum], code: int) -> Any:
    """A broker's code as a member; one this client does not know is UNKNOWN (as Java's
    ``fromCode``), not an error that loses the whole answer."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


def _set_fields(
    obj: Any,
    resource_type: E,
    name: str | None,
    pattern_type: E,
    principal: str | None,
    host: str | None,
    operation: E,
    permission_type: E,
) -> None:
    """A binding's or a filter's fields, enum values given as members, codes or names."""
    set_ = object.__setattr__  # (both are frozen)
    set_(obj, "resource_type", _member(ResourceType, resource_type, "resource_type"))
    set_(obj, "name", name)
    set_(obj, "pattern_type", _member(PatternType, pattern_type, "pattern_type"))
    set_(obj, "principal", principal)
    set_(obj, "host", host)
    set_(obj, "operation", _member(AclOperation, operation, "operation"))
    set_(obj, "permission_type", _member(AclPermissionType, permission_type, "permission_type"))


@dataclass(frozen=True)
class AclBinding:
    """One ACL: ``principal`` (``User:alice``) is allowed or denied ``operation`` on the
    resources ``name`` (a literal name, ``*`` for all, or a prefix) of ``resource_type``,
    from ``host`` (``*``: any)."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __init__(
        self,
        resource_type: E,
        name: str,
        pattern_type: E,
        principal: str,
        host: str,
        operation: E,
        permission_type: E,
    ) -> None:
        _set_fields(
            self, resource_type, name, pattern_type, principal, host, operation, permission_type
        )

    def _check_concrete(self) -> None:
        """What a broker would refuse to create, said before asking (Java's
        ``AclBinding.isUnknown`` / ``matchesAtMostOne`` checks in createAcls)."""
        vague = []
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            vague.append("resource_type")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            vague.append("pattern_type")
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            vague.append("operation")
        if self.permission_type in (AclPermissionType.UNKNOWN, AclPermissionType.ANY):
            vague.append("permission_type")
        if not self.name or not self.principal or not self.host:
            vague.append("name, principal and host (all required)")
        if vague:
            raise KcoreError(
                f"{self}: an ACL to create names one resource type, LITERAL or PREFIXED, one "
                f"operation and ALLOW or DENY; check {', '.join(vague)}"
            )

    def __str__(self) -> str:
        return (
            f"({self.permission_type.name} {self.principal} {self.operation.name} from "
            f"{self.host} on {self.resource_type.name} {self.pattern_type.name} {self.name!r})"
        )


@dataclass(frozen=True)
class AclBindingFilter:
    """Which ACLs to describe or delete: each field narrows, ``ANY`` or ``None`` does not.
    ``AclBindingFilter()`` matches every ACL."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def __init__(
        self,
        resource_type: E = ResourceType.ANY,
        name: str | None = None,
        pattern_type: E = PatternType.ANY,
        principal: str | None = None,
        host: str | None = None,
        operation: E = AclOperation.ANY,
        permission_type: E = AclPermissionType.ANY,
    ) -> None:
        _set_fields(
            self, resource_type, name, pattern_type, principal, host, operation, permission_type
        )

    def _check_known(self) -> None:
        """A filter with an UNKNOWN field makes the broker drop the connection (Java refuses it
        before asking, as here)."""
        unknown = [k for k, v in vars(self).items() if isinstance(v, enum.Enum) and v.value == 0]
        if unknown:
            raise KcoreError(f"{self}: {', '.join(unknown)} may not be UNKNOWN in a filter")

    @classmethod
    def of(cls, binding: AclBinding) -> AclBindingFilter:
        """The filter matching exactly ``binding``."""
        return cls(
            binding.resource_type,
            binding.name,
            binding.pattern_type,
            binding.principal,
            binding.host,
            binding.operation,
            binding.permission_type,
        )

    def __str__(self) -> str:
        parts = [
            f"{k}={v.name if isinstance(v, enum.Enum) else v!r}"
            for k, v in vars(self).items()
            if v is not None and not (isinstance(v, enum.Enum) and v.name == "ANY")
        ]
        return f"filter({', '.join(parts) or 'any ACL'})"


class AclOperations(AdminClientPart):
    """Part of :class:`~kcore.admin.AsyncAdminClient` (a base class of it): its ACL
    operations. Each request goes to any broker: creations and deletions are forwarded to the
    controller, and a broker answers a describe from its own authorizer, which applies changes
    from the metadata log moments after the controller accepted them (so a describe right
    after a change may not show it yet). Retriable errors are retried until the call's
    timeout. A broker without an authorizer answers SECURITY_DISABLED
    (``SecurityDisabledError``)."""

    async def create_acls(
        self, bindings: Iterable[AclBinding], *, timeout: float | None = None
    ) -> None:
        """Create the ACLs (one that exists already is not an error). Raises
        ``AdminOperationError`` mapping each binding that failed to its error."""
        wanted = list(dict.fromkeys(bindings))
        for b in wanted:
            if not isinstance(b, AclBinding):
                raise KcoreError(f"create_acls takes AclBinding objects, not {type(b).__name__}")
            b._check_concrete()
        if not wanted:
            return
        errors: dict[AclBinding, KcoreError] = {}
        done: set[AclBinding] = set()

        async def attempt() -> None:
            todo = [b for b in wanted if b not in done and b not in errors]
            response = await self._send_any(
                lambda version: CreateAclsRequest(creations=[_creation(b) for b in todo]),
                ApiKey.CREATE_ACLS,
            )
            retry: KafkaError | None = None
            for b, result in _answered(todo, response.results, "creation", errors):
                err = error_for_code(result.error_code, result.error_message)
                if err is None:
                    done.add(b)
                    continue
                if err.retriable:
                    retry = err
                else:
                    errors[b] = err
            if retry is not None:
                raise retry

        try:
            await self._retrying("create_acls", attempt, timeout)
        except KcoreError as exc:  # out of time: say which were created and which not
            _out_of_time(exc, wanted, done, errors)
        if errors:
            raise AdminOperationError("create_acls", errors, {})

    async def describe_acls(
        self, acl_filter: AclBindingFilter | None = None, *, timeout: float | None = None
    ) -> list[AclBinding]:
        """The ACLs matching ``acl_filter`` (default: all of them)."""
        f = acl_filter or AclBindingFilter()
        f._check_known()

        async def attempt() -> list[AclBinding]:
            response = await self._send_any(
                lambda version: DescribeAclsRequest(
                    resource_type_filter=int(f.resource_type),
                    resource_name_filter=f.name,
                    pattern_type_filter=int(f.pattern_type),
                    principal_filter=f.principal,
                    host_filter=f.host,
                    operation=int(f.operation),
                    permission_type=int(f.permission_type),
                ),
                ApiKey.DESCRIBE_ACLS,
            )
            err = error_for_code(response.error_code)
            if err is not None:
                raise err.with_message(f"describe_acls: {response.error_message or err.message}")
            return [
                _binding(r.resource_type, r.resource_name, r.pattern_type, a)
                for r in response.resources
                for a in r.acls
            ]

        result: list[AclBinding] = await self._retrying("describe_acls", attempt, timeout)
        return result

    async def delete_acls(
        self, filters: Iterable[AclBindingFilter], *, timeout: float | None = None
    ) -> dict[AclBindingFilter, list[AclBinding]]:
        """Delete every ACL matching each filter; returns the ACLs each filter deleted. Raises
        ``AdminOperationError`` mapping each filter that failed, or any of whose ACLs could not
        be deleted, to its error; its ``results`` holds what each filter did delete (also one
        that failed in part)."""
        wanted = list(dict.fromkeys(filters))
        for f in wanted:
            if not isinstance(f, AclBindingFilter):
                raise KcoreError(
                    f"delete_acls takes AclBindingFilter objects, not {type(f).__name__}"
                )
            f._check_known()
        results: dict[AclBindingFilter, list[AclBinding]] = {}
        errors: dict[AclBindingFilter, KcoreError] = {}
        if not wanted:
            return results

        async def attempt() -> None:
            todo = [f for f in wanted if f not in results and f not in errors]
            response = await self._send_any(
                lambda version: DeleteAclsRequest(filters=[_delete_filter(f) for f in todo]),
                ApiKey.DELETE_ACLS,
            )
            retry: KafkaError | None = None
            for f, result in _answered(todo, response.filter_results, "deletion", errors):
                err = error_for_code(result.error_code, result.error_message)
                if err is not None:
                    if err.retriable:
                        retry = err
                    else:
                        errors[f] = err
                    continue
                deleted, failed = [], []
                for m in result.matching_acls:
                    binding = _binding(m.resource_type, m.resource_name, m.pattern_type, m)
                    one = error_for_code(m.error_code)
                    if one is None:
                        deleted.append(binding)
                    else:
                        failed.append(f"{binding}: {m.error_message or one.message}")
                        first = one
                if failed:
                    errors[f] = first.with_message(
                        f"{len(failed)} of the ACLs it matched were not deleted: "
                        + "; ".join(failed)
                    )
                results[f] = deleted
            if retry is not None:
                raise retry

        try:
            await self._retrying("delete_acls", attempt, timeout)
        except KcoreError as exc:  # out of time: keep what was deleted
            _out_of_time(exc, wanted, results, errors)
        if errors:
            raise AdminOperationError("delete_acls", errors, results)
        return results


def _answered(
    todo: list[T], answers: Sequence[Any], what: str, errors: dict[T, KcoreError]
) -> Iterator[tuple[T, Any]]:
    """Each item sent with the broker's answer for it (answers come in the order asked); an
    item the answer left out fails with UNKNOWN_SERVER_ERROR, as Java's client has it."""
    for i, item in enumerate(todo):
        if i < len(answers):
            yield item, answers[i]
        else:
            errors[item] = UnknownServerError(f"the broker reported no {what} result for it")


def _out_of_time(
    exc: KcoreError, wanted: list[T], settled: Container[T], errors: dict[T, KcoreError]
) -> None:
    """The call ran out of time (``exc``): if nothing was settled, that is the call's error;
    otherwise each item still open fails with it, and the caller reports them per item."""
    if not settled and not errors:
        raise exc
    errors.update({item: exc for item in wanted if item not in settled and item not in errors})


def _binding(resource_type: int, name: str, pattern_type: int, acl: Any) -> AclBinding:
    """A binding from a broker's answer (codes this client does not know become UNKNOWN)."""
    return AclBinding(
        _code(ResourceType, resource_type),
        name,
        _code(PatternType, pattern_type),
        acl.principal,
        acl.host,
        _code(AclOperation, acl.operation),
        _code(AclPermissionType, acl.permission_type),
    )


def _creation(b: AclBinding) -> AclCreation:
    return AclCreation(
        resource_type=int(b.resource_type),
        resource_name=b.name,
        resource_pattern_type=int(b.pattern_type),
        principal=b.principal,
        host=b.host,
        operation=int(b.operation),
        permission_type=int(b.permission_type),
    )


def _delete_filter(f: AclBindingFilter) -> DeleteAclsFilter:
    return DeleteAclsFilter(
        resource_type_filter=int(f.resource_type),
        resource_name_filter=f.name,
        pattern_type_filter=int(f.pattern_type),
        principal_filter=f.principal,
        host_filter=f.host,
        operation=int(f.operation),
        permission_type=int(f.permission_type),
    )
