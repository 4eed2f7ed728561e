"""The committed ``kcore/admin/client.py`` (the blocking ``AdminClient``) must be exactly what
``tools/generate_admin_facade.py`` makes from ``AsyncAdminClient``, and declare each of its
operations as the async client does."""

from __future__ import annotations

import inspect
import pydoc
import sys
from pathlib import Path

import kcore
from kcore.admin import AdminClient, AsyncAdminClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools import generate_admin_facade  # noqa: E402


def test_committed_client_matches_the_generator() -> None:
    committed = generate_admin_facade.OUTPUT.read_text(encoding="utf-8")
    assert committed == generate_admin_facade.generate(), (
        "src/kcore/admin/client.py is stale; run python tools/generate_admin_facade.py"
    )


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "client.py"
    assert generate_admin_facade.main(["--output", str(out)]) == 0
    assert generate_admin_facade.main(["--output", str(out), "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    assert generate_admin_facade.main(["--output", str(out), "--check"]) == 1


def test_every_async_operation_is_a_blocking_method_with_its_signature() -> None:
    ops = generate_admin_facade.operations(AsyncAdminClient)
    names = {op.name for op in ops}
    assert {n for n in dir(AdminClient) if not n.startswith("_")} == names | {"close", "cluster"}
    assert len(names) == 32  # the operations and wait_until_ready
    for op in ops:
        hidden = generate_admin_facade.HIDDEN_PARAMETERS.get(op.name, {})
        expected = inspect.signature(op.function)
        expected = expected.replace(
            parameters=[p for p in expected.parameters.values() if p.name not in hidden]
        )
        assert inspect.signature(getattr(AdminClient, op.name)) == expected, op.name


def test_help_shows_the_signature_and_docstring() -> None:
    text = pydoc.render_doc(kcore.AdminClient.create_topics, renderer=pydoc.plaintext)
    assert "create_topics(self, new_topics: 'Iterable[NewTopic | str]', *," in text
    assert "validate_only: 'bool' = False, timeout: 'float | None' = None" in text
    assert "Create topics; returns ``{name: None}`` once the controller accepted them" in text
