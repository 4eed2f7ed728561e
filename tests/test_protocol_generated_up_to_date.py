"""The committed ``kcore/protocol/messages`` must be exactly what ``tools/generate_protocol.py``
makes from the kafka-clients jar of ``PROTOCOL_SOURCE_VERSION``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kcore.testing.versions import PROTOCOL_SOURCE_VERSION

REPO = Path(__file__).resolve().parent.parent
MESSAGES_DIR = REPO / "src" / "kcore" / "protocol" / "messages"
sys.path.insert(0, str(REPO))

from tools import generate_protocol  # noqa: E402


@pytest.fixture(scope="module")
def jar() -> Path:
    from tools.kafka_jar import kafka_clients_jar

    # Maven and the jar are required (as for the broker tests): a missing jar fails, never skips.
    return kafka_clients_jar(PROTOCOL_SOURCE_VERSION)


def test_committed_messages_match_the_generator(jar: Path, tmp_path: Path) -> None:
    out = tmp_path / "messages"
    assert generate_protocol.main(["--jar", str(jar), "--out", str(out)]) == 0
    generated = {p.name: p.read_text(encoding="utf-8") for p in out.glob("*.py")}
    committed = {p.name: p.read_text(encoding="utf-8") for p in MESSAGES_DIR.glob("*.py")}
    stale = sorted(
        name
        for name in generated.keys() | committed.keys()
        if generated.get(name) != committed.get(name)
    )
    assert not stale, (
        f"{len(stale)} generated file(s) are stale, e.g. {stale[:5]}; "
        "run python tools/generate_protocol.py"
    )
    assert len(generated) >= 199  # 198 definitions + the registry


def test_committed_compiled_decoders_match_the_generator(jar: Path, tmp_path: Path) -> None:
    """The compiled decoders (kcore/protocol/_decoders.pyx and its stub) are generated with the
    Python classes, from the same schema, by the same run."""
    out = tmp_path / "messages"
    assert generate_protocol.main(["--jar", str(jar), "--out", str(out)]) == 0
    for name in ("_decoders.pyx", "_decoders.pyi"):
        generated = (tmp_path / name).read_text(encoding="utf-8")
        committed = (MESSAGES_DIR.parent / name).read_text(encoding="utf-8")
        assert generated == committed, f"{name} is stale; run python tools/generate_protocol.py"
    # --check looks at them too.
    (tmp_path / "_decoders.pyx").write_text("# edited\n", encoding="utf-8")
    assert generate_protocol.main(["--jar", str(jar), "--out", str(out), "--check"]) == 1


def test_check_mode_reports_stale_files(jar: Path, tmp_path: Path) -> None:
    out = tmp_path / "messages"
    args = ["--jar", str(jar), "--out", str(out)]
    assert generate_protocol.main(args) == 0
    assert generate_protocol.main([*args, "--check"]) == 0
    (out / "metadata_request.py").write_text("# edited\n", encoding="utf-8")
    (out / "extra.py").write_text("", encoding="utf-8")
    (out / "fetch_request.py").unlink()
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "generate_protocol.py"), *args, "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    for name in ("metadata_request.py", "extra.py", "fetch_request.py"):
        assert name in result.stdout


def test_generation_is_deterministic(jar: Path) -> None:
    sources = generate_protocol.read_jar_sources(jar)
    first = generate_protocol.generate(sources, PROTOCOL_SOURCE_VERSION)
    second = generate_protocol.generate(
        dict(reversed(list(sources.items()))), PROTOCOL_SOURCE_VERSION
    )
    assert first == second


def test_json_comment_stripping_keeps_strings() -> None:
    text = '{\n  // a comment\n  "about": "see http://x // not a comment", // trailing\n  "v": 1\n}'
    data = json.loads(generate_protocol.strip_json_comments(text))
    assert data == {"about": "see http://x // not a comment", "v": 1}
