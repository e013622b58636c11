"""``schemathesis`` against the server's own OpenAPI schema, on a real server.

Every operation the schema lists gets bounded, schema-driven examples: valid
ones (positive) and ones that break the schema (negative). Whatever comes
back must not be a 5xx, must use a status code the schema documents for that
operation, and must match the documented body schema, headers and content
type. The server is ``rel_server`` (tiny random encoder). Each operation
reports its first failure; the test lists them all.

(schemathesis's own pytest plugin does not run under pytest 9 yet, so the
operations are driven with hypothesis here directly.)
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.conftest import ServerProcess

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
EXAMPLES = 10  # per operation and mode: ~25 operations x 2 modes, well under 2 minutes


def test_every_response_is_documented_and_never_a_5xx(rel_server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{rel_server.url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    failures: dict[str, str] = {}
    calls = 0
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def run(case) -> None:  # type: ignore[no-untyped-def]
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=rel_server.url, checks=CHECKS, timeout=60)

            try:
                run()
            except Unsatisfiable:  # nothing in this operation can be made invalid
                assert mode is GenerationMode.NEGATIVE, op.label
            except Exception as e:  # noqa: BLE001 - collected and reported below
                failures[f"{op.label} ({mode.value})"] = str(e)[:1500]
    assert failures == {}, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert calls >= len(operations) * 3
    assert rel_server.get("/health").status_code == 200
