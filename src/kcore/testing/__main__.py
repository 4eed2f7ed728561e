"""``python -m kcore.testing fetch`` fetches (and caches) the Kafka jars;
``python -m kcore.testing run [--brokers N]`` runs a cluster until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from . import _cds, jars, versions
from .cluster import KafkaCluster, train_cds_archive
from .errors import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcore.testing")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="fetch the Kafka jars into the cache, print their dir")
    fetch.add_argument("--kafka-version", default=None)
    run = sub.add_parser("run", help="run a local Kafka cluster until interrupted")
    run.add_argument("--brokers", type=int, default=1)
    run.add_argument("--kafka-version", default=None)
    run.add_argument("--advertised-host", default=None)
    run.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        args.kafka_version = args.kafka_version or versions.kafka_version()
        if args.command == "fetch":
            started = time.monotonic()
            libs = jars.kafka_libs(args.kafka_version)
            java = jars.java_executable()
            print(f"Kafka {args.kafka_version} jars: {libs} ({time.monotonic() - started:.1f}s)")
            started = time.monotonic()
            archive = _cds.Archives(java, libs, args.kafka_version)
            archive.ensure(train_cds_archive)
            if archive.path.is_file():
                print(f"JVM class-data archive: {archive.path} ({time.monotonic() - started:.1f}s)")
            return 0
        # SIGTERM and SIGINT (even if ignored, as in a background job) stop the cluster cleanly
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with KafkaCluster(
            args.brokers,
            kafka_version=args.kafka_version,
            advertised_host=args.advertised_host,
            work_dir=args.work_dir,
        ) as cluster:
            print(f"bootstrap servers: {cluster.bootstrap_servers} (work dir {cluster.work_dir})")
            print("Ctrl-C stops the cluster.", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
