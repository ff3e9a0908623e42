"""deploy/k8s is a kustomize base whose every resource Kubernetes would accept, and which keeps
the deployment's promises: probes on /healthz and /readyz, resources, termination grace above
the shutdown grace, disruption budgets, config and secrets by reference, a migrate Job, and a
KEDA ScaledObject that scales workers on (ready + running jobs) / slots per worker.

No kustomize binary is needed: the base (and the hpa-fallback component) is assembled here in
Python, supporting exactly the kustomization fields the files use and failing on any other.
Built-in kinds are validated with kubernetes-validate (strict: unknown fields are errors)
against the oldest and newest Kubernetes versions we support. KEDA's ScaledObject is a CRD that
kubernetes-validate has no schema for: it is checked structurally (known fields only, types,
references), its HPA behaviour against the built-in HPA schema, its PromQL by a parser."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from taskline import metrics
from taskline.settings import Settings, env_names

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s"
HPA_FALLBACK = BASE / "components" / "hpa-fallback"
K8S_VERSIONS = ("1.27", kubernetes_validate.latest_version())
CLUSTER_SCOPED = {"Namespace"}
SERVICES = ("api", "worker", "maintenance")
KNOWN_FIELDS = {"Kustomization": {"apiVersion", "kind", "namespace", "resources", "components",
                                  "images", "patches"},
                "Component": {"apiVersion", "kind", "resources", "patches"}}


# --- assembly ------------------------------------------------------------------------------

def _load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _key(resource: dict) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def _kustomization(folder: Path, kind: str) -> dict:
    """A folder's kustomization.yaml, refused when it uses a field this assembly ignores."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["kind"] == kind, folder
    unknown = set(kustomization) - KNOWN_FIELDS[kind]
    assert not unknown, f"{folder}: kustomization fields the test does not assemble: {unknown}"
    return kustomization


def _resources(folder: Path, entries: list[str]) -> list[dict]:
    resources = []
    for entry in entries:
        path = folder / entry
        resources += build(path) if path.is_dir() else _load_all(path)
    return resources


def build(folder: Path) -> list[dict]:
    """The resources `kustomize build folder` emits, for the kustomization fields this
    repository uses (resources, components, `$patch: delete` patches, namespace, images)."""
    kustomization = _kustomization(folder, "Kustomization")
    resources = _resources(folder, kustomization.get("resources", []))
    for component in (folder / c for c in kustomization.get("components", [])):
        spec = _kustomization(component, "Component")
        resources += _resources(component, spec.get("resources", []))
        resources = _patch(resources, spec.get("patches", []), component)
    resources = _patch(resources, kustomization.get("patches", []), folder)
    return _set_images(_set_namespace(resources, kustomization.get("namespace")),
                       kustomization.get("images", []))


def _patch(resources: list[dict], patches: list[dict], folder: Path) -> list[dict]:
    """Strategic-merge patches of the one form used here: `$patch: delete` of a resource."""
    for entry in patches:
        assert set(entry) <= {"patch", "path"}, f"unsupported patch options: {entry}"
        patch = yaml.safe_load(entry["patch"] if "patch" in entry
                               else (folder / entry["path"]).read_text())
        assert patch.get("$patch") == "delete", f"only $patch: delete is assembled: {patch}"
        assert _key(patch) in {_key(r) for r in resources}, f"patch matches nothing: {patch}"
        resources = [r for r in resources if _key(r) != _key(patch)]
    return resources


def _set_namespace(resources: list[dict], namespace: str | None) -> list[dict]:
    if namespace is None:
        return resources
    out = copy.deepcopy(resources)
    for resource in out:
        if resource["kind"] not in CLUSTER_SCOPED:
            resource["metadata"]["namespace"] = namespace
    return out


def _containers(resource: dict) -> list[dict]:
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def _set_images(resources: list[dict], images: list[dict]) -> list[dict]:
    out = copy.deepcopy(resources)
    for rule in images:
        for container in (c for r in out for c in _containers(r)):
            if container["image"].split(":")[0] == rule["name"]:
                container["image"] = f"{rule.get('newName', rule['name'])}:{rule['newTag']}"
    return out


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return build(BASE)


@pytest.fixture(scope="module")
def with_hpa(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The overlay docs/deployment.md shows for clusters without KEDA."""
    overlay = tmp_path_factory.mktemp("overlay")
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "taskline", "resources": [str(BASE)], "components": [str(HPA_FALLBACK)]}))
    return build(overlay)


def _one(resources: list[dict], kind: str, name: str) -> dict:
    (found,) = [r for r in resources if _key(r) == (kind, name)]
    return found


# --- schema validation ---------------------------------------------------------------------

def _validate(resources: list[dict]) -> list[str]:
    errors = []
    for resource in resources:
        if resource["apiVersion"].startswith("keda.sh/"):
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                path = ".".join(map(str, err.path))
                errors.append(f"{_key(resource)} on {version}: {path}: {err.message}")
    return errors


def test_every_builtin_resource_of_the_base_is_valid(base):
    assert _validate(base) == []


def test_the_hpa_fallback_is_valid_and_replaces_the_scaledobject(with_hpa):
    assert _validate(with_hpa) == []
    assert all(r["metadata"].get("namespace") == "taskline" for r in with_hpa
               if r["kind"] != "Namespace")
    kinds = {r["kind"] for r in with_hpa}
    assert "ScaledObject" not in kinds and "HorizontalPodAutoscaler" in kinds
    hpa = _one(with_hpa, "HorizontalPodAutoscaler", "worker")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "worker"}
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_the_validator_rejects_a_broken_manifest(base):
    # Guards the tests above: a misspelt field must be reported in strict mode.
    broken = copy.deepcopy(_one(base, "Deployment", "worker"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    assert _validate([broken])


def test_the_base_has_every_piece(base):
    keys = {_key(r) for r in base}
    for name in SERVICES:
        assert {("Deployment", name), ("Service", name), ("PodDisruptionBudget", name)} <= keys
    assert {("Job", "migrate"), ("ConfigMap", "taskline-config"), ("Secret", "taskline-secrets"),
            ("ScaledObject", "worker"), ("Namespace", "taskline")} <= keys
    assert all(r["metadata"].get("namespace") == "taskline" for r in base
               if r["kind"] != "Namespace")


# --- the deployment's promises -------------------------------------------------------------

def _pod(base: list[dict], name: str) -> dict:
    kind = "Job" if name == "migrate" else "Deployment"
    return _one(base, kind, name)["spec"]["template"]["spec"]


def _container(base: list[dict], name: str, container_name: str | None = None) -> dict:
    """The container named `container_name` (default: `name`) of the pod of `name`."""
    (container,) = [c for c in _pod(base, name)["containers"]
                    if c["name"] == (container_name or name)]
    return container


def test_every_pod_runs_the_one_image_with_its_command(base):
    images = {_container(base, name)["image"] for name in (*SERVICES, "migrate")}
    assert images == {"taskline:0.1.0"}
    for name in (*SERVICES, "migrate"):
        assert _container(base, name)["args"][0] == name


def test_api_probes_liveness_and_readiness(base):
    api = _container(base, "api")
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert api[probe]["httpGet"]["port"] == api["ports"][0]["name"], probe


def test_the_api_service_reaches_gunicorn_only_through_the_proxy(base):
    """The Service targets the proxy container's port; the proxy is nginx with the repository's
    configuration (deploy/nginx/nginx.conf, verbatim), as locked down as the api container."""
    proxy = _container(base, "api", "proxy")
    service = _one(base, "Service", "api")
    assert service["spec"]["ports"][0]["targetPort"] == proxy["ports"][0]["name"] == "http"
    assert proxy["ports"][0]["containerPort"] == 8080
    assert proxy["image"].startswith("nginxinc/nginx-unprivileged:")
    assert proxy["image"].split(":")[1] not in ("", "latest")
    config = _one(base, "ConfigMap", "api-proxy")["data"]["nginx.conf"]
    assert config == (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    (mount,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == "/etc/nginx/nginx.conf"]
    volumes = {v["name"]: v for v in _pod(base, "api")["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == "api-proxy"
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"cpu", "memory"} <= set(proxy["resources"]["requests"])
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The proxy outlives the api container's in-flight requests when the pod stops.
    api_stop = _container(base, "api")["lifecycle"]["preStop"]["exec"]["command"]
    assert proxy["lifecycle"]["preStop"]["exec"]["command"] == api_stop


def test_worker_and_maintenance_probe_their_metrics_port(base):
    for name in ("worker", "maintenance"):
        container = _container(base, name)
        args = container["args"]
        port = int(args[args.index("--metrics-port") + 1])
        assert container["ports"][0]["containerPort"] == port
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}


def test_every_container_has_resources_and_runs_locked_down(base):
    for name in (*SERVICES, "migrate"):
        container = _container(base, name)
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
        assert "memory" in container["resources"]["limits"], name
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert _pod(base, name)["securityContext"]["runAsNonRoot"] is True, name


def _config(base: list[dict]) -> dict:
    return _one(base, "ConfigMap", "taskline-config")["data"]


def test_termination_grace_covers_the_shutdown_grace(base):
    grace = max(Settings().shutdown_grace_s, float(_config(base)["TASKLINE_SHUTDOWN_GRACE_S"]))
    for name in SERVICES:
        pre_stop = _container(base, name).get("lifecycle", {}).get("preStop", {})
        sleep = float(pre_stop["exec"]["command"][1]) if pre_stop else 0.0
        assert _pod(base, name)["terminationGracePeriodSeconds"] > grace + sleep, name


def test_settings_come_from_the_configmap_and_the_secret(base):
    secret = _one(base, "Secret", "taskline-secrets")["stringData"]
    assert {"DATABASE_URL", "REDIS_URL", "TASKLINE_API_TOKENS", "TASKLINE_JWT_KEY",
            "TASKLINE_DATABASE_DIRECT_URL"} == set(secret)
    for name in (*SERVICES, "migrate"):
        sources = _container(base, name)["envFrom"]
        assert {"configMapRef": {"name": "taskline-config"}} in sources, name
        assert {"secretRef": {"name": "taskline-secrets"}} in sources, name
    # Every key is a variable taskline reads, with a value its Settings accept.
    data = _config(base)
    assert set(data) <= set(env_names())
    Settings.from_env({**data, **secret})  # raises on a value taskline would refuse


def test_disruption_budgets_select_their_pods(base):
    for name in SERVICES:
        budget = _one(base, "PodDisruptionBudget", name)["spec"]
        labels = _one(base, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert budget["selector"]["matchLabels"].items() <= labels.items(), name
    assert _one(base, "Deployment", "maintenance")["spec"]["replicas"] == 2


# --- the KEDA ScaledObject (a CRD: checked structurally) -----------------------------------

SCALEDOBJECT_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod",
                     "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount",
                     "maxReplicaCount", "fallback", "advanced", "triggers"}
PROMETHEUS_METADATA = {"serverAddress", "query", "threshold", "activationThreshold",
                       "metricType", "namespace", "ignoreNullValues", "unsafeSsl",
                       "queryParameters", "customHeaders"}


@pytest.fixture(scope="module")
def scaled(base) -> dict:
    scaled = _one(base, "ScaledObject", "worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    return scaled["spec"]


def test_scaledobject_fields_are_keda_fields(scaled):
    assert set(scaled) <= SCALEDOBJECT_SPEC
    assert scaled["scaleTargetRef"] == {"name": "worker"}
    assert 1 <= scaled["minReplicaCount"] <= scaled["maxReplicaCount"]
    fallback = scaled["fallback"]
    assert scaled["minReplicaCount"] <= fallback["replicas"] <= scaled["maxReplicaCount"]
    assert all(isinstance(scaled[k], int) for k in ("pollingInterval", "cooldownPeriod"))


def test_scaledobject_hpa_behaviour_is_a_valid_hpa_behaviour(base, scaled):
    # KEDA copies it verbatim into the HPA it creates, so the built-in schema applies.
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "probe"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": "worker"}, "maxReplicas": 2,
                    "behavior": scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]}}
    assert _validate([hpa]) == []


def _trigger(scaled: dict) -> dict:
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus"
    return trigger["metadata"]


def test_prometheus_trigger_metadata_is_strings(scaled):
    meta = _trigger(scaled)
    assert set(meta) <= PROMETHEUS_METADATA
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's metadata is map[string]string
    assert meta["serverAddress"].startswith("http")
    assert meta["metricType"] == "AverageValue" and float(meta["threshold"]) > 0


def _selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []
    promql_parser.walk(expr, lambda node: found.append(node)
                       if isinstance(node, promql_parser.VectorSelector) else None)
    return found


def _metric_names() -> set[str]:
    return {m.describe()[0].name for m in vars(metrics).values()
            if isinstance(m, MetricWrapperBase)}


def test_scaling_query_reads_jobs_and_slots_of_the_workers_queue(base, scaled):
    expr = promql_parser.parse(_trigger(scaled)["query"])
    used = {s.name for s in _selectors(expr)}
    assert used == {"job_queue_depth", "taskline_worker_busy_slots", "taskline_worker_slots"}
    assert used <= _metric_names()
    args = _container(base, "worker")["args"]
    queues = args[args.index("--queues") + 1].split(",")
    depth = [s for s in _selectors(expr) if s.name == "job_queue_depth"]
    assert [(m.name, m.value) for s in depth for m in s.matchers.matchers] == [
        ("queue", q) for q in queues]
