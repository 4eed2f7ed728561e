"""``kcore acls``: list, add and remove ACLs (what Kafka's ``kafka-acls --list``, ``--add``
and ``--remove`` do), through the admin client's create/describe/delete_acls."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from kcore.admin.types import AdminOperationError
from kcore.errors import KcoreError

__all__ = ["add_acls_args", "run_acls"]

_RESOURCES = (
    ("topic", "TOPIC"),
    ("group", "GROUP"),
    ("transactional_id", "TRANSACTIONAL_ID"),
    ("user", "USER"),
)


def add_acls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "add", "remove"),
        default="list",
        help="list (default), add or remove",
    )
    p.add_argument("--topic", help="ACLs on this topic (name, prefix with --pattern, or *)")
    p.add_argument("--group", help="ACLs on this consumer group")
    p.add_argument("--transactional-id", help="ACLs on this transactional id")
    p.add_argument("--user", help="ACLs on this user (delegation tokens, quotas)")
    p.add_argument("--cluster", action="store_true", help="ACLs on the cluster")
    p.add_argument(
        "--pattern",
        choices=("literal", "prefixed", "any", "match"),
        help="how the name matches: literal (the default, as kafka-acls), prefixed; for list "
        "and remove also any or match (every ACL that applies to the name)",
    )
    p.add_argument(
        "--allow-principal", action="append", default=[], metavar="P", help="e.g. User:alice"
    )
    p.add_argument("--deny-principal", action="append", default=[], metavar="P")
    p.add_argument(
        "--principal", help="list/remove: only ACLs of this principal (or use --allow/deny-)"
    )
    p.add_argument(
        "--operation",
        action="append",
        default=[],
        metavar="OP",
        help="READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, IdempotentWrite, ... (repeatable; "
        "add's default: ALL)",
    )
    p.add_argument("--host", help="from this host (add's default: *)")


def _resource(args: argparse.Namespace) -> tuple[str, str | None]:
    given = [(kind, getattr(args, attr)) for attr, kind in _RESOURCES if getattr(args, attr)]
    if args.cluster:
        given.append(("CLUSTER", "kafka-cluster"))
    if len(given) > 1:
        raise KcoreError(
            "name one resource: --topic, --group, --transactional-id, --user or --cluster"
        )
    return given[0] if given else ("ANY", None)


def _bindings(args: argparse.Namespace) -> list[Any]:
    from kcore.admin.acls import AclBinding

    kind, name = _resource(args)
    principals = [(p, "ALLOW") for p in args.allow_principal]
    principals += [(p, "DENY") for p in args.deny_principal]
    if name is None or not principals:
        raise KcoreError(
            "add needs a resource (--topic ...) and --allow-principal or --deny-principal"
        )
    pattern = args.pattern or "literal"
    return [
        AclBinding(kind, name, pattern, principal, args.host or "*", op, permission)
        for principal, permission in principals
        for op in args.operation or ["ALL"]  # as kafka-acls
    ]


def _filters(args: argparse.Namespace) -> list[Any]:
    from kcore.admin.acls import AclBindingFilter

    kind, name = _resource(args)
    principals = [(p, "ALLOW") for p in args.allow_principal]
    principals += [(p, "DENY") for p in args.deny_principal]
    if args.principal:
        principals.append((args.principal, "ANY"))
    # As kafka-acls: a named resource means its literal ACLs unless --pattern says otherwise
    # (a remove must not take a PREFIXED ACL of the same name along); no resource, every ACL.
    pattern = args.pattern or ("literal" if name is not None else "any")
    return [
        AclBindingFilter(kind, name, pattern, principal, args.host, op, permission)
        for principal, permission in (principals or [(None, "ANY")])
        for op in (args.operation or ["ANY"])
    ]


def _as_json(binding: Any) -> dict[str, Any]:
    return {
        k: v.name if hasattr(v, "name") and not isinstance(v, str) else v
        for k, v in vars(binding).items()
    }


def _print(bindings: list[Any], as_json: bool) -> None:
    bindings = list(dict.fromkeys(bindings))  # overlapping filters find some twice
    if as_json:
        print(json.dumps([_as_json(b) for b in bindings], indent=2))
        return
    for b in sorted(bindings, key=lambda b: (b.resource_type, b.name, b.principal, b.operation)):
        print(str(b)[1:-1])


def run_acls(config: Mapping[str, Any], args: argparse.Namespace) -> int:
    from kcore.admin.client import AdminClient

    if args.action == "add":
        bindings = _bindings(args)
        with AdminClient(config) as admin:
            admin.wait_until_ready()  # fail fast: the cluster unreachable is said at once
            admin.create_acls(bindings)
        _print(bindings, args.json)
        return 0
    filters = _filters(args)
    if args.action == "remove" and all(f.resource_type.name == "ANY" for f in filters):
        # Refused before connecting: there is nothing to ask the cluster.
        raise KcoreError("remove needs a resource (--topic ...): it would match every ACL")
    with AdminClient(config) as admin:
        admin.wait_until_ready()
        if args.action == "remove":
            try:
                deleted = admin.delete_acls(filters)
            except AdminOperationError as exc:  # what was deleted is printed all the same
                _print([b for found in exc.results.values() for b in found], args.json)
                raise
            _print([b for found in deleted.values() for b in found], args.json)
            return 0
        found = list(dict.fromkeys(b for f in filters for b in admin.describe_acls(f)))
    _print(found, args.json)
    return 0
