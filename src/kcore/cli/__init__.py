"""The ``kcore`` command line (also ``python -m kcore``): ``metadata``, ``produce``, ``consume``,
``groups``, ``acls`` and ``doctor``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from kcore.errors import ConfigError, KcoreError

__all__ = ["main"]


def _client_config(args: argparse.Namespace) -> dict[str, Any]:
    """``-F`` properties files, then ``-X`` pairs, then ``bootstrap.servers`` from ``-b``.

    A file's settings for another kind of client are left out with a warning (one
    client.properties usually serves producers and consumers alike, as Java's tools and
    librdkafka take it); ``-X`` is exact, so a typo or a wrong-role key there still fails."""
    from kcore.cli.properties import load_properties
    from kcore.config import other_client_setting

    role = _ROLES[args.command]
    config: dict[str, Any] = {}
    for path in args.config_file or []:
        for key, value in load_properties(path).items():
            if other_client_setting(key, role):
                print(
                    f"kcore {args.command}: -F {path}: ignoring {key} (not {_an(role)} setting)",
                    file=sys.stderr,
                )
                continue
            config[key] = value
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(key, "-X takes key=value")
        config[key.strip()] = value
    if args.bootstrap:
        config.pop("metadata.broker.list", None)  # -b replaces the file's, whichever name
        config["bootstrap.servers"] = args.bootstrap
    elif not config.get("bootstrap.servers") and not config.get("metadata.broker.list"):
        raise ConfigError("bootstrap.servers", "give -b HOST:PORT (or bootstrap.servers in -F)")
    return config


def _an(role: str) -> str:
    return f"an {role}" if role[0] in "aeiou" else f"a {role}"


# The client each command runs, whose settings -X and -F take.
_ROLES: dict[str, Literal["admin", "producer", "consumer", "share_consumer"]] = {
    "metadata": "admin",
    "groups": "admin",
    "acls": "admin",
    "doctor": "admin",
    "produce": "producer",
    "consume": "consumer",
}


def _parsed(config: dict[str, Any], command: str, share: bool = False) -> Any:
    from kcore.config import STRICT_KEY, ClientConfig

    # -X is exact: another client's key there is refused (strict mode), not ignored.
    role = "share_consumer" if share else _ROLES[command]
    extra = {"group.id": "-"} if share else {}  # (the group comes from --share-group)
    return ClientConfig({**extra, **config, STRICT_KEY: True}, role=role)


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-b",
        "--bootstrap",
        help="bootstrap servers, HOST:PORT[,HOST:PORT...] (else bootstrap.servers from -F/-X)",
    )
    p.add_argument(
        "-X",
        dest="set",
        action="append",
        metavar="KEY=VALUE",
        help="a client config setting (Java names, e.g. -X security.protocol=SSL); repeatable",
    )
    p.add_argument(
        "-F",
        "--config-file",
        action="append",
        metavar="FILE",
        help="a Java properties file of client settings (like --command-config)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the client does")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot check itself: an error (exit status 2) as argparse's."""
    if args.command == "groups":
        if args.count is not None and args.watch is None:
            parser.error("groups: --count goes with --watch")
        if args.watch is not None and not args.group:
            parser.error("groups: --watch needs the groups to watch (-g GROUP)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kcore", description="kcore: a Kafka client")
    sub = parser.add_subparsers(dest="command", required=True)
    meta = sub.add_parser(
        "metadata", help="list brokers, topics, partitions, leaders, replicas and ISR"
    )
    _add_connection_args(meta)
    meta.add_argument(
        "-t", "--topic", action="append", help="only this topic (repeatable); default: all"
    )
    meta.add_argument("--internal", action="store_true", help="include internal topics")
    produce = sub.add_parser("produce", help="send lines of stdin or files as records")
    _add_connection_args(produce)
    produce.add_argument("-t", "--topic", required=True)
    produce.add_argument("files", nargs="*", metavar="FILE", help="read these (default: stdin)")
    produce.add_argument("-p", "--partition", type=int, help="all records to this partition")
    produce.add_argument(
        "-K", dest="key_separator", metavar="SEP", help="split each line into key SEP value"
    )
    produce.add_argument(
        "-H",
        dest="header",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a header on every record (repeatable)",
    )
    consume = sub.add_parser("consume", help="print a topic's records")
    _add_connection_args(consume)
    consume.add_argument("-t", "--topic", required=True)
    consume.add_argument(
        "-p",
        "--partition",
        type=int,
        action="append",
        default=[],
        help="only this partition (repeatable); default: all",
    )
    consume.add_argument(
        "-o",
        "--offset",
        default="beginning",
        help="beginning (default), end, an offset, or -N (N before the end)",
    )
    consume.add_argument("-c", "--count", type=int, help="stop after this many records")
    consume.add_argument(
        "-e", "--exit", action="store_true", help="stop at the end offsets seen at start"
    )
    consume.add_argument("-g", "--group", help="join this consumer group (subscribe, commit)")
    consume.add_argument(
        "--share-group",
        metavar="GROUP",
        help="read as a member of this share group (KIP-932), accepting each record printed",
    )
    consume.add_argument(
        "-K", dest="key_separator", metavar="SEP", help="print key SEP value per record"
    )
    groups = sub.add_parser(
        "groups",
        help="list consumer and share groups, or describe some: state, members and lag",
    )
    _add_connection_args(groups)
    groups.add_argument(
        "-g", "--group", action="append", default=[], help="describe this group (repeatable)"
    )
    groups.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_positive_seconds,
        metavar="SECONDS",
        help="describe the groups again every SECONDS (default 2) until Ctrl-C; with --json, "
        "one JSON line per group and refresh",
    )
    groups.add_argument(
        "--count", type=_positive_int, metavar="N", help="with --watch: stop after N refreshes"
    )
    acls = sub.add_parser("acls", help="list, add or remove ACLs (as kafka-acls)")
    _add_connection_args(acls)
    from kcore.cli.acls import add_acls_args

    add_acls_args(acls)
    doctor = sub.add_parser(
        "doctor", help="diagnose bootstrap, advertised-listener, TLS and SASL problems"
    )
    _add_connection_args(doctor)
    doctor.add_argument("--group", help="also find and reach this consumer group's coordinator")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    with _sigterm_as_interrupt():
        try:
            return _run(args)
        except KcoreError as exc:
            print(f"kcore {args.command}: {exc}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            # `kcore ... | head`: the reader has had enough; nothing more goes to it (Python
            # would otherwise complain again when it flushes stdout at exit).
            _stdout_to_devnull()
            return 0
        except KeyboardInterrupt:
            return 130


def _run(args: argparse.Namespace) -> int:
    raw = _client_config(args)
    share = args.command == "consume" and args.share_group is not None
    config = _parsed(raw, args.command, share)  # checked up front: a bad key fails here
    if args.command == "produce":
        from kcore.cli.produce import run_produce

        return run_produce(
            config,
            args.topic,
            args.files,
            args.partition,
            args.key_separator,
            args.header,
            args.json,
        )
    if share:
        from kcore.cli.consume import run_share_consume

        if args.partition or args.group or args.exit or args.offset != "beginning":
            raise KcoreError(
                "--share-group reads what the share group hands out: not with -p, -o, -e or -g"
            )
        return run_share_consume(
            raw, args.topic, args.share_group, args.count, args.key_separator, args.json
        )
    if args.command == "consume":
        from kcore.cli.consume import parse_offset, run_consume

        return run_consume(
            raw,
            args.topic,
            args.partition,
            parse_offset(args.offset),
            args.count,
            args.exit,
            args.group,
            args.key_separator,
            args.json,
        )
    if args.command == "groups":
        from kcore.cli.groups import run_groups, watch_groups

        if args.watch is not None:
            return watch_groups(config, args.group, args.json, args.watch, args.count)
        return run_groups(config, args.group, args.json)
    if args.command == "acls":
        from kcore.cli.acls import run_acls

        return run_acls(config, args)
    if args.command == "metadata":
        from kcore.cli.metadata import run_metadata

        return run_metadata(config, args.topic, args.internal, args.json)
    from kcore.cli.doctor import render_text, run_doctor

    servers = list(config["bootstrap.servers"])
    report = asyncio.run(run_doctor(servers, config, args.group))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report))
    return 0 if report.ok else 1


# Events a command's loop checks between steps: SIGTERM sets them instead of interrupting
# wherever the main thread is (a poll half done would skip records in a group's commit).
SOFT_STOPS: list[threading.Event] = []


def _stdout_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``timeout``, ``docker stop``, systemd) ends a command as Ctrl-C does: produce
    flushes what it took and reports, a group consume commits and leaves. Main thread only;
    the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        # A loop that stops itself between steps (consume: nothing half-read), unless it was
        # asked already and is stuck (writing to a full pipe): then as Ctrl-C.
        if SOFT_STOPS and not all(stop.is_set() for stop in SOFT_STOPS):
            for stop in SOFT_STOPS:
                stop.set()
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
