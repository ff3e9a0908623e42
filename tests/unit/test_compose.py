"""docker-compose.yml is a valid Compose Specification file (no Docker engine runs here, so the
JSON schema is the check) and keeps the stack's promises: PostgreSQL 15 and Redis 7 with health
checks and named volumes, Redis never evicting; a one-shot migrate that every taskline service
waits for; workers that scale (no fixed name, no host port) and get their whole shutdown grace;
two maintenance replicas; and the service names, ports and mounts that
deploy/prometheus/prometheus.yml and grafana/provisioning expect."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from taskline.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# shared/ (the project's common folder) sits beside the checkout, in CI as on a developer's box.
SCHEMA_PLACES = [ROOT.parent / "shared" / "schemas" / "compose-spec.json",
                 Path("/work/shared/schemas/compose-spec.json")]
TASKLINE = ("migrate", "api", "worker", "maintenance")
SERVED = ("api", "worker", "maintenance")
EXPECTED = {"postgres", "redis", *TASKLINE, "proxy", "prometheus", "grafana", "redis-exporter",
            "postgres-exporter"}
NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def schema() -> dict:
    for place in SCHEMA_PLACES:
        if place.is_file():
            return json.loads(place.read_text())
    raise AssertionError(f"compose-spec.json not found in any of {SCHEMA_PLACES}")


def _default(value: str) -> str:
    """A string with every `${NAME:-default}` replaced by its default (innermost first)."""
    pattern = re.compile(r"\$\{[A-Z_][A-Z0-9_]*:-([^${}]*)\}")
    while pattern.search(value):
        value = pattern.sub(lambda m: m[1], value)
    return value


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|s|m|h)", duration))


def _env_example_value(name: str) -> str:
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{name} missing from .env.example")


def test_compose_file_matches_the_compose_specification(compose: dict, schema: dict):
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(compose)]
    assert errors == []


def test_the_schema_rejects_a_broken_file(schema: dict):
    # Guards the test above: a misspelt key must be reported, so the validator is really on.
    broken = {"services": {"redis": {"image": "redis:7", "helthcheck": {}}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_the_stack_has_exactly_the_services_prometheus_scrapes(services: dict):
    assert set(services) == EXPECTED


def test_servers_are_the_versions_taskline_supports(services: dict):
    assert services["postgres"]["image"].startswith("postgres:15")
    assert services["redis"]["image"].startswith("redis:7")


def test_servers_have_health_checks_and_named_volumes(compose: dict, services: dict):
    declared = set(compose["volumes"])
    for name in ("postgres", "redis", "prometheus", "grafana"):
        service = services[name]
        assert service["healthcheck"]["test"], name
        sources = [v.split(":", 1)[0] for v in service["volumes"]]
        named = {s for s in sources if not s.startswith((".", "/"))}
        assert named and named <= declared, name


def test_redis_never_evicts_and_keeps_nothing_on_disk(services: dict):
    command = services["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--save"] == ""
    assert options["--appendonly"] == "no"


def test_migrate_runs_once_and_every_service_waits_for_it(services: dict):
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in SERVED:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name


def test_taskline_services_run_the_one_image_against_the_stack_servers(services: dict):
    images = {services[name]["image"] for name in TASKLINE}
    assert len(images) == 1
    for name in TASKLINE:
        service = services[name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert service["command"][0] == name
        env = service["environment"]
        assert "@postgres:5432/" in _default(env["DATABASE_URL"]), name
        assert _default(env["REDIS_URL"]).startswith("redis://redis:6379"), name


def test_served_services_use_the_image_health_check(services: dict):
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for name in SERVED:
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and json.dumps(test[1:]) in dockerfile, name
    assert services["migrate"]["healthcheck"] == {"disable": True}


def test_workers_scale_freely(services: dict):
    for name in ("worker", "maintenance"):
        assert "container_name" not in services[name], name
        assert "ports" not in services[name], name


def test_worker_stop_grace_covers_the_shutdown_grace(services: dict):
    grace = max(Settings().shutdown_grace_s,
                float(_env_example_value("TASKLINE_SHUTDOWN_GRACE_S")))
    assert _seconds(services["worker"]["stop_grace_period"]) > grace


def test_two_maintenance_replicas(services: dict):
    assert services["maintenance"]["deploy"]["replicas"] == 2


def _scrape_jobs() -> dict[str, int]:
    """Prometheus job name -> the port it scrapes, from deploy/prometheus/prometheus.yml."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    ports = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            ports[job["job_name"]] = sd["port"]
        for static in job.get("static_configs", []):
            ports[job["job_name"]] = int(static["targets"][0].rsplit(":", 1)[1])
    return ports


def _listens_on(service: dict) -> set[int]:
    ports = {int(p) for p in service.get("expose", [])}
    ports |= {int(str(p).rsplit(":", 1)[1]) for p in service.get("ports", [])}
    command = service.get("command", [])
    if "--bind" in command:
        ports.add(int(command[command.index("--bind") + 1].rsplit(":", 1)[1]))
    return ports


def test_every_prometheus_target_is_a_service_on_its_port(services: dict):
    jobs = _scrape_jobs()
    assert set(jobs) - {"prometheus"} == {"api", "worker", "maintenance", "redis-exporter",
                                           "postgres-exporter"}
    for job, port in jobs.items():
        if job != "prometheus":
            assert port in _listens_on(services[job]), job


def test_worker_and_maintenance_serve_metrics_where_prometheus_looks(services: dict):
    for name in ("worker", "maintenance"):
        command = services[name]["command"]
        assert command[command.index("--metrics-port") + 1] == str(_scrape_jobs()[name])


def test_prometheus_and_grafana_mount_the_repository_config(services: dict):
    assert "./deploy/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    grafana = services["grafana"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    assert "127.0.0.1:3000:3000" in grafana["ports"]
    datasources = (ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    assert "http://prometheus:9090" in datasources.read_text()


def test_exporters_watch_the_stack_servers(services: dict):
    assert services["redis-exporter"]["image"].startswith("oliver006/redis_exporter:")
    assert services["redis-exporter"]["environment"]["REDIS_ADDR"] == "redis://redis:6379"
    assert services["postgres-exporter"]["image"].startswith(
        "prometheuscommunity/postgres-exporter:")
    dsn = _default(services["postgres-exporter"]["environment"]["DATA_SOURCE_NAME"])
    assert "@postgres:5432/taskline" in dsn


def test_third_party_images_are_pinned(services: dict):
    for name in EXPECTED - set(TASKLINE):
        image = services[name]["image"]
        assert ":" in image and not image.endswith(":latest"), name


def test_ports_are_published_on_loopback_only(services: dict):
    for name, service in services.items():
        assert all(str(p).startswith("127.0.0.1:") for p in service.get("ports", [])), name


def test_every_interpolation_has_a_default():
    # `docker compose up` works without a .env file.
    text = (ROOT / "docker-compose.yml").read_text()
    bare = re.findall(r"\$\{([A-Z_][A-Z0-9_]*)\}", text)
    assert bare == []
    assert "${" not in _default(text)


# --- the reverse proxy ---------------------------------------------------------------------

def _nginx_directives() -> dict[str, list[str]]:
    """Every `name value;` of deploy/nginx/nginx.conf, by name (comments dropped)."""
    found: dict[str, list[str]] = {}
    text = "\n".join(line.split("#", 1)[0] for line in NGINX_CONF.read_text().splitlines())
    for statement in re.findall(r"([a-z_]+)\s+([^;{}]*);", text):
        found.setdefault(statement[0], []).append(statement[1].strip())
    return found


def _nginx_seconds(value: str) -> float:
    return _seconds(value if value[-1].isalpha() else value + "s")


def test_proxy_shares_the_api_namespace_and_mounts_the_repository_config(services: dict):
    proxy, api = services["proxy"], services["api"]
    assert proxy["network_mode"] == "service:api"
    assert "ports" not in proxy  # published by the api service, whose namespace it shares
    assert [_default(p) for p in api["ports"]] == ["127.0.0.1:8000:8080"]
    assert "./deploy/nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]
    assert proxy["read_only"] is True and "/tmp" in proxy["tmpfs"]
    assert proxy["image"].startswith("nginxinc/nginx-unprivileged:")


def test_proxy_reads_requests_whole_within_the_api_deadlines():
    """nginx buffers requests and answers, and its deadlines and body limit are the API's."""
    conf, defaults = _nginx_directives(), Settings()
    assert conf["listen"] == ["8080"]
    assert conf["server"] == ["127.0.0.1:8000"]
    assert conf["proxy_request_buffering"] == ["on"] and "on" in conf["proxy_buffering"]
    assert _nginx_seconds(conf["client_header_timeout"][0]) == defaults.http_header_timeout_s
    assert _nginx_seconds(conf["client_body_timeout"][0]) == defaults.http_body_timeout_s
    limit = conf["client_max_body_size"][0]
    assert int(limit.rstrip("m")) * 1024 * 1024 == defaults.max_payload_bytes
    assert _env_example_value("TASKLINE_MAX_PAYLOAD_BYTES") == str(defaults.max_payload_bytes)
    # Upstream connections are dropped by nginx before gunicorn's keepalive (5 s) would.
    upstream_idle = [_nginx_seconds(v) for v in conf["keepalive_timeout"]]
    assert min(upstream_idle) < 5
    # The event stream alone passes unbuffered.
    assert conf["proxy_buffering"].count("off") == 1


def test_proxy_answers_its_own_refusals_in_the_error_shape():
    pages = re.findall(r"return (\d{3}) '([^']*)';", NGINX_CONF.read_text())
    assert {status for status, _ in pages} >= {"400", "408", "413", "414", "431", "503"}
    for _, body in pages:
        error = json.loads(body)["error"]
        assert set(error) == {"code", "message", "details"} and error["code"]
    assert all(d.startswith("application/json") for d in _nginx_directives()["default_type"])


@pytest.mark.skipif(shutil.which("nginx") is None, reason="no nginx binary on this machine")
def test_nginx_accepts_the_proxy_config():
    result = subprocess.run(["nginx", "-t", "-c", str(NGINX_CONF)], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
