"""Hostile peers: a fake broker (``tests/hostile_broker.py``) answers correctly and then
misbehaves for one API, and a kcore client must end with a kcore error it can see (or keep
retrying with backoff), never hang, crash, storm the broker or lose a record it accepted.

Each probe runs in a child process with a hard time limit, so that a hang or a crash fails that
probe instead of stopping the suite. What a probe asserts:

* the child ended within ``PROBE_TIME_LIMIT_S`` ("hung" otherwise) and was not killed by a
  signal ("crashed");
* whatever the client operation raised is a ``kcore.errors.KcoreError``, and no exception
  other than a kcore or an OS one was logged;
* a producer's every accepted send was resolved: acknowledged, or failed with a kcore error;
* the fake broker saw at most ``elapsed / RETRY_BACKOFF_S + REQUEST_ALLOWANCE`` requests of the
  misbehaving API (or connections, for TLS and bootstrap probes). Every probe's client waits
  ``retry.backoff.ms`` = ``reconnect.backoff.ms`` = 200 ms (no exponential growth) between
  attempts, so an error that persists costs one request per backoff at most; the allowance
  covers the first attempts and the requests a healthy exchange makes before the misbehaviour
  starts.

Families: frame misbehaviours per API; error codes that persist; a transactional producer's
InitProducerId; Metadata with odd brokers; odd coordinators; corrupt record batches; Fetch
answers that make no progress; Produce answers that leave records out; group answers with
noise for consumer-protocol bytes; settings a peer then exposes (bad bootstrap names, a long
client.id, 2,000 dead addresses); TLS and SASL peers. A probe of a bug not fixed yet is a
strict xfail naming the class of bug.

The probes of the selected tests all start when the first of them needs its result, eight
child processes at a time (they mostly wait on timeouts); each test then checks its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kcore.protocol import ApiKey

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hostile_broker import (  # noqa: E402
    COORDINATOR_VARIANTS,
    ERROR_ANSWERS,
    FETCH_CORRUPTIONS,
    FETCH_NO_PROGRESS,
    FRAME_MISBEHAVIOURS,
    GROUP_VARIANTS,
    LIST_OFFSETS_VARIANTS,
    METADATA_VARIANTS,
    OFFSET_FETCH_VARIANTS,
    OPERATION_FOR_API,
    PRODUCE_VARIANTS,
    RETRY_BACKOFF_S,
    SASL_GARBAGE_CHALLENGE,
    TLS_HANGUP,
)

from kcore.testing.security import LocalPKI  # noqa: E402

pytestmark = pytest.mark.slow

PROBE_TIME_LIMIT_S = 25
REQUEST_ALLOWANCE = 8
# Probes mostly wait (for timeouts and backoffs), so several run at once on two cores.
CONCURRENT_PROBES = 8


def run_probe(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """Run one probe in a child process; fail if it hangs or crashes."""
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(HERE / "hostile_broker.py")]
    with subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        try:
            out, err = child.communicate(json.dumps(spec), timeout=PROBE_TIME_LIMIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            return {
                "failure": f"probe {name} hung (killed after {PROBE_TIME_LIMIT_S} s)",
                "stderr": err[-3000:],
            }
    if child.returncode < 0:
        failure = f"probe {name} crashed: {signal.Signals(-child.returncode).name}"
        return {"failure": failure, "stderr": err[-3000:]}
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        return {"failure": f"probe {name} exited with {child.returncode}", "stderr": err[-3000:]}
    return json.loads(lines[-1])


def check(
    report: dict[str, Any], name: str, api: int | None, *, must_succeed: bool = False
) -> None:
    """The rules every probe keeps (see the module docstring)."""
    if "failure" in report:
        pytest.fail(f"{report['failure']}\n{report['stderr']}")
    assert not report["fake_broker_errors"], "\n".join(report["fake_broker_errors"])
    error = report["error"]
    context = json.dumps(report, indent=1)[:4000]
    foreign = report["logged_foreign_exceptions"]
    if error is not None:
        assert error["kcore"], f"probe {name}: a non-kcore exception escaped\n{context}"
        assert not must_succeed, f"probe {name}: the operation should have worked\n{context}"
    outcome = report.get("outcome") or {}
    assert not foreign, f"probe {name}: a non-kcore exception logged: {foreign}\n{context}"
    if "sent" in outcome:
        assert outcome["unresolved"] == 0, (
            f"probe {name}: accepted sends left unresolved\n{context}"
        )
        assert "non_kcore_future_error" not in outcome, f"probe {name}\n{context}"
        if must_succeed:
            assert outcome["acked"] == outcome["sent"], f"probe {name}\n{context}"
    if must_succeed and "records" in outcome:
        assert outcome["records"] == 5, f"probe {name}: records not read\n{context}"
    bound = report["elapsed_s"] / RETRY_BACKOFF_S + REQUEST_ALLOWANCE
    what = "connections" if api is None else f"{ApiKey(api).name} requests"
    seen = report["connections"] if api is None else report["requests"].get(ApiKey(api).name, 0)
    assert seen <= bound, (
        f"probe {name}: retry storm, {seen} {what} in {report['elapsed_s']:.1f} s "
        f"(bound {bound:.0f})\n{context}"
    )


# -- frame misbehaviours, per API ------------------------------------------------------------

FRAME_APIS = {
    "ApiVersions": ApiKey.API_VERSIONS,
    "Metadata": ApiKey.METADATA,
    "Produce": ApiKey.PRODUCE,
    "Fetch": ApiKey.FETCH,
    "ListOffsets": ApiKey.LIST_OFFSETS,
    "FindCoordinator": ApiKey.FIND_COORDINATOR,
    "JoinGroup": ApiKey.JOIN_GROUP,
    "InitProducerId": ApiKey.INIT_PRODUCER_ID,
}
# The first Metadata answer is right (the bootstrap), the later ones misbehave; for the other
# APIs every answer misbehaves.
ANSWER_FIRST = {ApiKey.METADATA: 1}


def _marks(probe_id: str) -> list[Any]:
    """Marks of a probe: none today (every class these probes found is fixed); the place to
    put a strict xfail naming the class of bug of a probe that fails."""
    return []


FRAME_PROBES = [
    pytest.param(api_name, how, id=f"{api_name}-{how}", marks=_marks(f"{api_name}-{how}"))
    for api_name in FRAME_APIS
    for how in FRAME_MISBEHAVIOURS
]


def frame_spec(api_name: str, how: str) -> dict[str, Any]:
    api = FRAME_APIS[api_name]
    return {
        "api": int(api),
        "misbehaviour": how,
        "answer_first": ANSWER_FIRST.get(api, 0),
        "operation": OPERATION_FOR_API[api],
    }


@pytest.mark.parametrize(("api_name", "how"), FRAME_PROBES)
def test_frame_misbehaviour(probes: ProbeRunner, api_name: str, how: str) -> None:
    api = FRAME_APIS[api_name]
    name = f"{api_name}-{how}"
    report = probes.result(name)
    # An answer that comes slowly is still an answer.
    check(report, name, api, must_succeed=how == "byte_at_a_time")


# -- a transactional producer's InitProducerId -------------------------------------------------

TXN_INIT_PROBES = [*FRAME_MISBEHAVIOURS, "retriable_error", "unknown_server_error"]


@pytest.mark.parametrize("how", TXN_INIT_PROBES)
def test_transactional_init(probes: ProbeRunner, how: str) -> None:
    """init_transactions against a coordinator whose InitProducerId answers misbehave: a
    kcore error that names the last failure (a timeout alone says nothing), or success."""
    name = f"txn-InitProducerId-{how}"
    report = probes.result(name)
    check(report, name, ApiKey.INIT_PRODUCER_ID, must_succeed=how == "byte_at_a_time")
    error = report["error"]
    if error is not None and error["type"].endswith("KcoreTimeoutError"):
        assert "(last: " in error["message"], error["message"]


# -- error codes that persist ----------------------------------------------------------------

ERROR_PROBES = [
    pytest.param(api_name, how, id=f"{api_name}-{how}", marks=_marks(f"{api_name}-{how}"))
    for api_name in FRAME_APIS
    if api_name != "ApiVersions"
    for how in ERROR_ANSWERS
]


@pytest.mark.parametrize(("api_name", "how"), ERROR_PROBES)
def test_error_answers(probes: ProbeRunner, api_name: str, how: str) -> None:
    """Every answer of the API carries the error: retried with backoff, or raised."""
    name = f"{api_name}-{how}"
    check(probes.result(name), name, FRAME_APIS[api_name])


# -- metadata with odd brokers -----------------------------------------------------------------

# A broker with any int32 node id, listed among thousands, is still a broker.
WORKING_METADATA = {"node_id_int32_max", "node_id_above_2_30", "five_thousand_brokers"}


@pytest.mark.parametrize(
    "variant", [pytest.param(v, marks=_marks(f"Metadata-{v}")) for v in METADATA_VARIANTS]
)
def test_metadata_variant(probes: ProbeRunner, variant: str) -> None:
    name = f"Metadata-{variant}"
    report = probes.result(name)
    check(report, name, ApiKey.METADATA, must_succeed=variant in WORKING_METADATA)


# -- corrupt record batches ------------------------------------------------------------------


@pytest.mark.parametrize(
    "corruption", [pytest.param(c, marks=_marks(f"Fetch-{c}")) for c in FETCH_CORRUPTIONS]
)
def test_corrupt_record_batch(probes: ProbeRunner, corruption: str) -> None:
    """A corrupt batch stops the partition with a CorruptRecordError the caller sees."""
    name = f"Fetch-{corruption}"
    report = probes.result(name)
    check(report, name, ApiKey.FETCH)
    error = report["error"]
    assert error is not None and error["corrupt_record"], (
        f"probe {name}: the corrupt batch was not reported\n{json.dumps(report, indent=1)}"
    )


@pytest.mark.parametrize("corruption", FETCH_CORRUPTIONS)
def test_a_corrupt_batch_error_names_the_partition_and_offset(
    probes: ProbeRunner, corruption: str
) -> None:
    error = probes.result(f"Fetch-{corruption}")["error"]
    assert "hostile" in error["message"] and "offset" in error["message"], error["message"]


# -- fetch answers that make no progress ---------------------------------------------------


@pytest.mark.parametrize(
    "variant", [pytest.param(v, marks=_marks(f"Fetch-{v}")) for v in FETCH_NO_PROGRESS]
)
def test_fetch_answer_without_progress(probes: ProbeRunner, variant: str) -> None:
    """Answers holding only batches that end before the fetch offset: fetched again after a
    backoff (never at once, in a loop), then a CorruptRecordError from poll naming the
    partition and the offset."""
    name = f"Fetch-{variant}"
    report = probes.result(name)
    check(report, name, ApiKey.FETCH)
    error = report["error"]
    assert error is not None and error["corrupt_record"], (
        f"probe {name}: the answers without progress were not reported\n"
        f"{json.dumps(report, indent=1)}"
    )
    assert "hostile-0" in error["message"] and "offset 5" in error["message"], error["message"]


# -- odd coordinators ---------------------------------------------------------------------------

# As Java's client: a coordinator is dialled where FindCoordinator says, listed in Metadata
# or not; an address that cannot be dialled is a connection error, and it is looked up again.
WORKING_COORDINATORS = {
    "coordinator_node_id_above_2_30",
    "coordinator_node_id_int32_max",
    "coordinator_node_id_negative",
    "coordinator_node_id_unknown",
}


@pytest.mark.parametrize(
    "variant",
    [pytest.param(v, marks=_marks(f"FindCoordinator-{v}")) for v in COORDINATOR_VARIANTS],
)
def test_coordinator_variant(probes: ProbeRunner, variant: str) -> None:
    """FindCoordinator names an odd coordinator (listed in Metadata too, as a real cluster
    lists it, except ``coordinator_node_id_unknown``)."""
    name = f"FindCoordinator-{variant}"
    report = probes.result(name)
    check(report, name, ApiKey.FIND_COORDINATOR, must_succeed=variant in WORKING_COORDINATORS)


# -- group answers with noise for consumer-protocol bytes ----------------------------------------


@pytest.mark.parametrize("variant", GROUP_VARIANTS)
def test_group_answer_variant(probes: ProbeRunner, variant: str) -> None:
    """Subscriptions or an assignment that do not parse: a kcore error from poll()."""
    name = f"group-{variant}"
    report = probes.result(name)
    api = ApiKey.JOIN_GROUP if variant.startswith("join") else ApiKey.SYNC_GROUP
    check(report, name, api)
    assert report["error"] is not None, report


# -- ListOffsets answers that leave the partition out or name a negative offset ----------------


@pytest.mark.parametrize("variant", LIST_OFFSETS_VARIANTS)
@pytest.mark.parametrize("operation", ["end_offsets", "fetch"])
def test_list_offsets_answer_variant(probes: ProbeRunner, variant: str, operation: str) -> None:
    """end_offsets() and a consumer's offset reset: a partition the answer leaves out is asked
    again with backoff, and never dropped from end_offsets()'s result in silence."""
    name = f"ListOffsets-{variant}-{operation}"
    report = probes.result(name)
    check(report, name, ApiKey.LIST_OFFSETS)
    if variant == "list_offsets_partition_missing" and operation == "end_offsets":
        assert report["error"] is not None, report


@pytest.mark.parametrize("variant", OFFSET_FETCH_VARIANTS)
@pytest.mark.parametrize("operation", ["committed", "group"])
def test_offset_fetch_answer_variant(probes: ProbeRunner, variant: str, operation: str) -> None:
    """As Java's: a partition the answer leaves out, or with an offset below 0, has no
    committed offset (committed() gives None; the group member resets and reads)."""
    name = f"OffsetFetch-{variant}-{operation}"
    report = probes.result(name)
    check(report, name, ApiKey.OFFSET_FETCH, must_succeed=True)


# -- produce answers that do not account for what was sent ------------------------------------


@pytest.mark.parametrize("variant", PRODUCE_VARIANTS)
def test_produce_answer_variant(probes: ProbeRunner, variant: str) -> None:
    """Records the answer does not account for are retried, then failed at
    delivery.timeout.ms: never left pending, never acknowledged."""
    name = f"Produce-{variant}"
    report = probes.result(name)
    check(report, name, ApiKey.PRODUCE)
    assert report["outcome"]["acked"] == 0, report["outcome"]


# -- settings a peer then exposes ------------------------------------------------------------

DEAD_BOOTSTRAP = ",".join(f"127.0.0.1:{port}" for port in range(1, 2001))
CLIENT_PROBES = {
    "bootstrap-host-empty-label": {"bootstrap.servers": "kafka..example.com:9092"},
    "bootstrap-host-label-too-long": {"bootstrap.servers": "a" * 64 + ".example.com:9092"},
    "client-id-too-long": {"client.id": "x" * 40_000},
    "bootstrap-2000-dead-addresses": {"bootstrap.servers": DEAD_BOOTSTRAP},
}


@pytest.mark.parametrize(
    "probe",
    [
        pytest.param(p, marks=_marks(p))
        for p in ("bootstrap-host-empty-label", "bootstrap-host-label-too-long")
    ],
)
def test_a_bad_bootstrap_host_name_is_a_bootstrap_error(probes: ProbeRunner, probe: str) -> None:
    report = probes.result(probe)
    check(report, probe, None)
    assert report["error"]["type"].endswith("BootstrapError"), report


def test_a_client_id_too_long_is_a_config_error(probes: ProbeRunner) -> None:
    report = probes.result("client-id-too-long")
    check(report, "client-id-too-long", None)
    assert report["error"]["type"].endswith("ConfigError"), report


def test_dead_bootstrap_servers_end_in_a_bootstrap_error(probes: ProbeRunner) -> None:
    """2,000 addresses that refuse connections: BootstrapError at the timeout (close() used to
    hang on the bootstrap's rounds, which had swallowed their cancellation)."""
    report = probes.result("bootstrap-2000-dead-addresses")
    check(report, "bootstrap-2000-dead-addresses", None)
    assert report["error"]["type"].endswith("BootstrapError"), report["error"]


def test_a_bootstrap_error_about_many_addresses_stays_readable(probes: ProbeRunner) -> None:
    report = probes.result("bootstrap-2000-dead-addresses")
    assert report["error"]["length"] <= 10_000, report["error"]["length"]


def test_a_bad_frame_size_at_api_versions_does_not_blame_tls(probes: ProbeRunner) -> None:
    """A size of -1 is no TLS record (those start 0x15 0x03 or 0x16 0x03)."""
    report = probes.result("ApiVersions-size_minus_one")
    assert "TLS" not in report["error"]["message"], report["error"]["message"]


# -- TLS and SASL peers ------------------------------------------------------------------------

TLS_PROBES = ("tls-expired-certificate", "tls-untrusted-certificate", "tls-hangup-mid-handshake")
SASL_PROBES = {
    # name: (the API that misbehaves, how, the mechanism)
    "sasl-handshake-garbage": (ApiKey.SASL_HANDSHAKE, "garbage", "PLAIN"),
    "sasl-handshake-truncated": (ApiKey.SASL_HANDSHAKE, "truncated", "PLAIN"),
    "sasl-handshake-never-answers": (ApiKey.SASL_HANDSHAKE, "never_answers", "PLAIN"),
    "sasl-authenticate-garbage": (ApiKey.SASL_AUTHENTICATE, "garbage", "PLAIN"),
    "sasl-authenticate-wrong-correlation-id": (
        ApiKey.SASL_AUTHENTICATE,
        "wrong_correlation_id",
        "PLAIN",
    ),  # fmt: skip
    "sasl-scram-garbage-challenge": (None, SASL_GARBAGE_CHALLENGE, "SCRAM-SHA-256"),
}
# What the error must name.
TLS_CAUSES = {
    "tls-expired-certificate": "expired",
    "tls-untrusted-certificate": "not trusted",
    "tls-hangup-mid-handshake": "handshake",
}


@pytest.fixture(scope="module")
def hostile_pki():
    """A CA the clients trust, and server certificates that fail: one expired (its validity
    ended before it began), one signed by a CA nobody trusts."""
    with LocalPKI() as pki:
        where = {"dns": ("localhost",), "ips": ("127.0.0.1",), "server": True}
        pki.days = -1
        expired = pki.issue("expired-server", **where)
        pki.days = 30
        untrusted = pki.issue("untrusted-server", issuer=pki.other_ca, **where)
        yield {
            "ca": str(pki.ca_cert),
            "tls-expired-certificate": [str(expired.cert), str(expired.key)],
            "tls-untrusted-certificate": [str(untrusted.cert), str(untrusted.key)],
        }


@pytest.mark.parametrize("probe", TLS_PROBES)
def test_tls_peer(probes: ProbeRunner, probe: str) -> None:
    report = probes.result(probe)
    check(report, probe, None)
    error = report["error"]
    assert error is not None and error["type"].endswith("BootstrapError"), report
    assert TLS_CAUSES[probe] in error["message"], error["message"]


@pytest.mark.parametrize("probe", list(SASL_PROBES))
def test_sasl_peer(probes: ProbeRunner, probe: str) -> None:
    report = probes.result(probe)
    api = SASL_PROBES[probe][0]
    check(report, probe, api)
    error = report["error"]
    assert error is not None, report
    text = error["message"].lower()
    assert "sasl" in text or "authentication" in text, error["message"]


# -- running the probes ------------------------------------------------------------------------


def probe_spec(
    test_name: str, params: dict[str, Any], pki: dict[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """The probe a test of this module reads: (its name, the child's spec)."""
    if test_name in {
        "test_a_bad_bootstrap_host_name_is_a_bootstrap_error",
        "test_a_client_id_too_long_is_a_config_error",
        "test_dead_bootstrap_servers_end_in_a_bootstrap_error",
        "test_a_bootstrap_error_about_many_addresses_stays_readable",
    }:
        name = params.get("probe") or {
            "test_a_client_id_too_long_is_a_config_error": "client-id-too-long",
        }.get(test_name, "bootstrap-2000-dead-addresses")
        return name, {"operation": "end_offsets", "config": CLIENT_PROBES[name]}
    if test_name == "test_a_bad_frame_size_at_api_versions_does_not_blame_tls":
        return "ApiVersions-size_minus_one", frame_spec("ApiVersions", "size_minus_one")
    if test_name == "test_tls_peer":
        name = params["probe"]
        tls = {"security.protocol": "SSL", "ssl.truststore.location": pki["ca"]}
        spec: dict[str, Any] = {"operation": "end_offsets", "config": tls}
        if name == "tls-hangup-mid-handshake":
            spec["misbehaviour"] = TLS_HANGUP
        else:
            spec["tls"] = pki[name]
        return name, spec
    if test_name == "test_sasl_peer":
        name = params["probe"]
        api, how, mechanism = SASL_PROBES[name]
        sasl = {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
        spec = {"misbehaviour": how, "operation": "end_offsets", "config": sasl}
        if api is not None:
            spec["api"] = int(api)
        return name, spec
    if test_name in ("test_frame_misbehaviour", "test_error_answers"):
        return f"{params['api_name']}-{params['how']}", frame_spec(**params)
    if test_name == "test_metadata_variant":
        spec = {"api": int(ApiKey.METADATA), "misbehaviour": params["variant"]}
        return f"Metadata-{params['variant']}", {**spec, "answer_first": 1, "operation": "produce"}
    if test_name == "test_transactional_init":
        spec = {"api": int(ApiKey.INIT_PRODUCER_ID), "misbehaviour": params["how"]}
        return f"txn-InitProducerId-{params['how']}", {**spec, "operation": "init_transactions"}
    if test_name == "test_coordinator_variant":
        spec = {"api": int(ApiKey.FIND_COORDINATOR), "misbehaviour": params["variant"]}
        return f"FindCoordinator-{params['variant']}", {**spec, "operation": "committed"}
    if test_name == "test_group_answer_variant":
        variant = params["variant"]
        api = ApiKey.JOIN_GROUP if variant.startswith("join") else ApiKey.SYNC_GROUP
        return f"group-{variant}", {"api": int(api), "misbehaviour": variant, "operation": "group"}
    if test_name == "test_list_offsets_answer_variant":
        variant, operation = params["variant"], params["operation"]
        spec = {"api": int(ApiKey.LIST_OFFSETS), "misbehaviour": variant, "operation": operation}
        return f"ListOffsets-{variant}-{operation}", spec
    if test_name == "test_offset_fetch_answer_variant":
        variant, operation = params["variant"], params["operation"]
        spec = {"api": int(ApiKey.OFFSET_FETCH), "misbehaviour": variant, "operation": operation}
        return f"OffsetFetch-{variant}-{operation}", spec
    if test_name == "test_produce_answer_variant":
        spec = {"api": int(ApiKey.PRODUCE), "misbehaviour": params["variant"]}
        return f"Produce-{params['variant']}", {**spec, "operation": "produce"}
    if test_name in (
        "test_corrupt_record_batch",
        "test_a_corrupt_batch_error_names_the_partition_and_offset",
    ):
        spec = {"api": int(ApiKey.FETCH), "misbehaviour": params["corruption"]}
        return f"Fetch-{params['corruption']}", {**spec, "operation": "fetch"}
    if test_name == "test_fetch_answer_without_progress":
        spec = {"api": int(ApiKey.FETCH), "misbehaviour": params["variant"]}
        return f"Fetch-{params['variant']}", {**spec, "operation": "fetch"}
    return None


class ProbeRunner:
    """Runs the selected tests' probes, CONCURRENT_PROBES child processes at a time."""

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        self._executor = ThreadPoolExecutor(CONCURRENT_PROBES)
        self._runs: dict[str, Future[dict[str, Any]]] = {
            name: self._executor.submit(run_probe, spec, name) for name, spec in specs.items()
        }

    def result(self, name: str) -> dict[str, Any]:
        return self._runs[name].result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def probes(request: pytest.FixtureRequest, hostile_pki: dict[str, Any]):
    specs = {}
    for item in request.session.items:
        if item.module is not request.module:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        found = probe_spec(item.originalname, params, hostile_pki)
        if found is not None:
            specs[found[0]] = found[1]
    runner = ProbeRunner(specs)
    yield runner
    runner.close()
