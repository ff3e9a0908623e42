"""docker-compose.yml is a valid Compose Specification file (no Docker engine runs here, so the
JSON schema is the check) and keeps the properties the servers need: PostgreSQL 15 and Redis 7
with health checks, data in named volumes, Redis never evicting and never persisting."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# shared/ (the project's common folder) sits beside the checkout, in CI as on a developer's box.
SCHEMA_PLACES = [ROOT.parent / "shared" / "schemas" / "compose-spec.json",
                 Path("/work/shared/schemas/compose-spec.json")]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def schema() -> dict:
    for place in SCHEMA_PLACES:
        if place.is_file():
            return json.loads(place.read_text())
    raise AssertionError(f"compose-spec.json not found in any of {SCHEMA_PLACES}")


def test_compose_file_matches_the_compose_specification(compose: dict, schema: dict):
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(compose)]
    assert errors == []


def test_the_schema_rejects_a_broken_file(schema: dict):
    # Guards the test above: a misspelt key must be reported, so the validator is really on.
    broken = {"services": {"redis": {"image": "redis:7", "helthcheck": {}}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_servers_are_the_versions_taskline_supports(compose: dict):
    services = compose["services"]
    assert set(services) == {"postgres", "redis"}
    assert services["postgres"]["image"].startswith("postgres:15")
    assert services["redis"]["image"].startswith("redis:7")


def test_every_server_has_a_health_check_and_a_named_volume(compose: dict):
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        assert service["healthcheck"]["test"], name
        named = {v.split(":", 1)[0] for v in service["volumes"]}
        assert named <= declared, name


def test_redis_never_evicts_and_keeps_nothing_on_disk(compose: dict):
    command = compose["services"]["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--save"] == ""
    assert options["--appendonly"] == "no"


def test_ports_are_published_on_loopback_only(compose: dict):
    for service in compose["services"].values():
        assert all(str(p).startswith("127.0.0.1:") for p in service["ports"])
