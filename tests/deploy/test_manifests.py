"""deploy/k8s, checked offline: every overlay renders with kubectl's kustomize; every document
validates, the built-in kinds against Kubernetes' own schemas (kubernetes-validate, strict) and
the custom resources against Istio's and the Prometheus Operator's types (cloudcoil's pydantic
models, unknown fields refused); and the manifests agree with what mmgate serves, read from its
code: setting names, health services, ports, metric names, the affinity header, the drain.

kubectl comes from PATH or build/bin (`make kubectl` puts one there); without it these fail.
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pydantic
import pytest
import yaml  # type: ignore[import-untyped]
from cloudcoil.models.istio.networking.v1 import DestinationRule
from cloudcoil.models.istio.networking.v1alpha3 import EnvoyFilter
from cloudcoil.models.istio.security.v1 import AuthorizationPolicy, PeerAuthentication
from cloudcoil.models.prometheus_operator.v1 import PrometheusRule, ServiceMonitor

from cache_actor import CacheActor, CacheConfig
from services.api.grpc_server import CACHE, HEALTH, INFERENCE, open_services
from services.api.health import LIVENESS, READINESS
from services.config import AuthSettings, Grant, Settings
from services.observability.metrics import Metrics
from services.wire import AFFINITY_HEADER
from tests.deploy.test_replicas import BALANCE_FACTOR
from tests.services.prom import DASHBOARD_NAMES, service_families

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
LOCAL_KUBECTL = ROOT / "build" / "bin" / "kubectl"
# the image each overlay runs (deploy/container/)
DOCKERFILES = {
    "cpu": ROOT / "deploy" / "container" / "Dockerfile",
    "gpu": ROOT / "deploy" / "container" / "Dockerfile.gpu",
}
# The Kubernetes versions mmgate's manifests support: 1.30 is the first with everything they use
# enabled by default (the preStop sleep action, matchLabelKeys in topology spread constraints)
KUBERNETES_VERSIONS = ("1.30.0", "1.32.0")
# the custom resources, by (apiVersion, kind): validated with their pydantic models
CUSTOM_RESOURCES: dict[tuple[str, str], type[pydantic.BaseModel]] = {
    ("networking.istio.io/v1", "DestinationRule"): DestinationRule,
    ("security.istio.io/v1", "PeerAuthentication"): PeerAuthentication,
    ("security.istio.io/v1", "AuthorizationPolicy"): AuthorizationPolicy,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PrometheusRule,
}
MMGATE = "mmgate"  # the Deployment, its container, Service and the pods' app.kubernetes.io/name

Doc = dict[str, Any]


# ── rendering ─────────────────────────────────────────────────────────────────────────────


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None and LOCAL_KUBECTL.is_file() and os.access(LOCAL_KUBECTL, os.X_OK):
        found = str(LOCAL_KUBECTL)
    if found is None:
        pytest.fail("kubectl not found on PATH or in build/bin: `make kubectl`", pytrace=False)
    return found


def render(folder: Path) -> list[Doc]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {folder} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def docs(rendered: dict[str, list[Doc]], overlay: str) -> list[Doc]:
    return rendered[overlay]


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def container(deployment: Doc, name: str) -> Doc:
    containers: list[Doc] = deployment["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == name]
    return found


def mmgate_container(docs: list[Doc]) -> Doc:
    return container(one(docs, "Deployment", MMGATE), MMGATE)


def env_of(docs: list[Doc], c: Doc) -> dict[str, str]:
    """A container's environment as the pod sees it: values, and keys of rendered ConfigMaps."""
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = one(docs, "ConfigMap", ref["name"])["data"][ref["key"]]
    return env


@pytest.fixture
def mmgate_env(docs: list[Doc]) -> dict[str, str]:
    return env_of(docs, mmgate_container(docs))


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """mmgate's settings as a pod with this environment loads them (nothing of this process's)."""
    for name in list(os.environ):
        if name.startswith("MMGATE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("MMGATE_"):
            monkeypatch.setenv(name, value)
    return Settings()


@pytest.fixture
def settings(mmgate_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    return settings_from(mmgate_env, monkeypatch)


def container_port(c: Doc, port: int | str) -> int:
    """A port number, or a port's name resolved in the container."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


def service_port(docs: list[Doc], service: str, port: int) -> tuple[Doc, Doc]:
    """The Service's port of that number, and the container behind it (a Deployment's)."""
    svc = one(docs, "Service", service)
    (entry,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
    selector = svc["spec"]["selector"]
    (deployment,) = [
        d
        for d in find(docs, "Deployment")
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    (c,) = [
        c
        for c in deployment["spec"]["template"]["spec"]["containers"]
        if any(p["name"] == entry["targetPort"] for p in c["ports"])
        or any(p["containerPort"] == entry["targetPort"] for p in c["ports"])
    ]
    return entry, c


# ── what mmgate serves, read from its code ───────────────────────────────────────────────


def setting_names(model: type[pydantic.BaseModel], prefix: str = "MMGATE_") -> set[str]:
    """Every environment variable of the settings: MMGATE_ and the field's path joined with __."""
    names: set[str] = set()
    for field_name, field in model.model_fields.items():
        name = prefix + field_name.upper()
        names.add(name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, pydantic.BaseModel):
            names |= setting_names(field.annotation, name + "__")
    return names


def exported_metrics() -> dict[str, str]:
    """What a scrape of mmgate carries, name -> type: every part's families from idle parts,
    and the interceptor's and hook's own metrics."""
    base = Settings(metrics={"port": 0})
    suffix = {"counter": "_total", "info": "_info"}
    found = [
        *service_families(cache=CacheActor(CacheConfig()).stats()),
        *Metrics(base).registry.collect(),
    ]
    return {f.name + suffix.get(f.type, ""): f.type for f in found}


def image_config(dockerfile: Path) -> tuple[dict[str, str], str]:
    """The ENV and USER of a Dockerfile's last stage: the image the pods run."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())  # continuation lines joined
    env: dict[str, str] = {}
    user = ""
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "FROM":
            env, user = {}, ""
        elif instruction == "ENV":
            for word in shlex.split(rest):
                name, _, value = word.partition("=")
                env[name] = value
        elif instruction == "USER":
            user = rest.strip()
    return env, user


def served_services() -> set[str]:
    """The gRPC services the server registers: mmgate's own, health and reflection."""
    return {INFERENCE, CACHE} | open_services(AuthSettings())


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mmgate_k8s_generate", K8S / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ── 1. rendering ──────────────────────────────────────────────────────────────────────────


def test_each_overlay_renders_every_part(docs: list[Doc]) -> None:
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert set(CUSTOM_RESOURCES) <= kinds
    assert {
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("policy/v1", "PodDisruptionBudget"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
        ("v1", "Namespace"),
    } <= kinds
    assert {d["metadata"]["name"] for d in find(docs, "Deployment")} == {
        MMGATE,
        "mmgate-redis",
        "jaeger",
    }
    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == {MMGATE}


def test_overlays_set_image_replicas_and_resources(rendered: dict[str, list[Doc]]) -> None:
    for overlay, docs in rendered.items():
        deployment = one(docs, "Deployment", MMGATE)
        c = mmgate_container(docs)
        assert c["image"] == f"mmgate:{overlay}"
        hpa = one(docs, "HorizontalPodAutoscaler", MMGATE)
        # the autoscaler takes over from the replicas the overlay starts with
        assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"] >= 2
        assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
        assert {"cpu", "memory"} <= c["resources"]["requests"].keys()
        assert "memory" in c["resources"]["limits"]
    cpu = mmgate_container(rendered["cpu"])
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]
    gpu_pod = one(rendered["gpu"], "Deployment", MMGATE)["spec"]["template"]["spec"]
    gpu = mmgate_container(rendered["gpu"])
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert gpu_pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu_pod[
        "tolerations"
    ]


# ── 2. validation ─────────────────────────────────────────────────────────────────────────


def is_built_in(doc: Doc) -> bool:
    api_version: str = doc["apiVersion"]
    group = api_version.rpartition("/")[0]
    return group == "" or "." not in group or group.endswith(".k8s.io")


def kubernetes_problem(doc: Doc, version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        return f"{doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError as e:
        return str(e.message)
    return None


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_built_in_kinds_validate_strictly(docs: list[Doc], version: str) -> None:
    built_in = [d for d in docs if is_built_in(d)]
    assert len(built_in) >= 15
    problems = [p for d in built_in if (p := kubernetes_problem(d, version)) is not None]
    assert problems == []


def test_custom_resources_validate_with_unknown_fields_refused(docs: list[Doc]) -> None:
    custom = [d for d in docs if not is_built_in(d)]
    assert {(d["apiVersion"], d["kind"]) for d in custom} == set(CUSTOM_RESOURCES)
    for doc in custom:
        CUSTOM_RESOURCES[doc["apiVersion"], doc["kind"]].model_validate(doc, extra="forbid")


def test_a_misspelled_field_is_refused(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["cpu"]
    rule = copy.deepcopy(one(docs, "DestinationRule", MMGATE))
    balancer = rule["spec"]["trafficPolicy"]["loadBalancer"]
    balancer["consistentHsh"] = balancer.pop("consistentHash")
    # the check has teeth only with extra="forbid": by default the model drops the typo silently
    DestinationRule.model_validate(rule)
    with pytest.raises(pydantic.ValidationError, match="consistentHsh"):
        DestinationRule.model_validate(rule, extra="forbid")
    deployment = copy.deepcopy(one(docs, "Deployment", MMGATE))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["grpc"]["servce"] = probe["grpc"].pop("service")
    for version in KUBERNETES_VERSIONS:
        problem = kubernetes_problem(deployment, version)
        assert problem is not None
        assert "servce" in problem


# ── 3. the manifests agree with mmgate ───────────────────────────────────────────────────


def test_every_mmgate_variable_is_a_setting(docs: list[Doc], settings: Settings) -> None:
    known = setting_names(Settings)
    assert {"MMGATE_AUTH__MODE", "MMGATE_HEALTH__ENGINE_HUNG_SECONDS", "MMGATE_PORT"} <= known
    used = {
        var["name"]
        for d in find(docs, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        for var in c.get("env", [])
        if var["name"].startswith("MMGATE_")
    }
    assert used, "no MMGATE_ variable found"
    assert used - known == set()
    # and the values load: the pod's settings are what the manifests mean
    assert settings.host == "0.0.0.0"
    assert settings.metrics.host == "0.0.0.0"
    assert settings.auth.mode == "mesh"
    assert settings.redis.url is not None
    assert settings.tracing.endpoint is not None


def test_probes_ask_the_health_services_mmgate_registers(
    docs: list[Doc], settings: Settings
) -> None:
    c = mmgate_container(docs)
    registered = {"", INFERENCE, CACHE, LIVENESS, READINESS}
    expected = {"startupProbe": READINESS, "readinessProbe": READINESS, "livenessProbe": LIVENESS}
    for probe, service in expected.items():
        grpc = c[probe]["grpc"]
        assert grpc["service"] == service, probe
        assert grpc["service"] in registered
        assert container_port(c, grpc["port"]) == settings.port, probe
    # kubelet's probes carry no credential: health stays open under the manifests' auth settings
    assert HEALTH in open_services(settings.auth)


def test_probe_timing_follows_the_watchdog(docs: list[Doc], settings: Settings) -> None:
    c = mmgate_container(docs)
    health = settings.health

    def window(probe: str) -> int:
        return int(c[probe]["periodSeconds"] * c[probe]["failureThreshold"])

    readiness = c["readinessProbe"]
    # readiness follows mmgate's verdict within a couple of seconds, probing no faster than
    # mmgate re-evaluates
    assert readiness["periodSeconds"] >= health.interval_seconds
    assert window("readinessProbe") <= 3
    liveness = c["livenessProbe"]
    # liveness restarts only on mmgate's own verdict (hung: engine_hung_seconds), soon after it;
    # a server that does not answer at all is restarted only once it has been silent for longer
    # than an engine stall, which costs readiness alone
    assert liveness["failureThreshold"] >= 2
    assert health.engine_stall_seconds <= window("livenessProbe") < health.engine_hung_seconds
    assert health.engine_hung_seconds + health.interval_seconds + window("livenessProbe") <= 180
    assert liveness["timeoutSeconds"] < liveness["periodSeconds"]
    # startup: minutes for a slow engine start
    assert window("startupProbe") >= 300


def test_ports_match_the_settings(docs: list[Doc], settings: Settings) -> None:
    c = mmgate_container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc-mmgate": settings.port, "http-metrics": settings.metrics.port}
    assert settings.port == Settings.model_fields["port"].default
    assert settings.metrics.port == 9464
    svc = one(docs, "Service", MMGATE)
    by_name = {p["name"]: p for p in svc["spec"]["ports"]}
    # the mesh balances each call (and hashes the affinity header) only on a port it knows is gRPC
    grpc = by_name["grpc-mmgate"]
    assert grpc.get("appProtocol") == "grpc"
    assert grpc["name"].startswith("grpc-")
    assert container_port(c, grpc["targetPort"]) == settings.port
    assert container_port(c, by_name["http-metrics"]["targetPort"]) == settings.metrics.port
    assert svc["spec"]["selector"].items() <= (
        one(docs, "Deployment", MMGATE)["spec"]["template"]["metadata"]["labels"].items()
    )


def test_autoscaler_and_scrape_use_what_mmgate_exports(docs: list[Doc], settings: Settings) -> None:
    exported = exported_metrics()
    # the same names the live server's /metrics is checked for (tests/services/test_metrics.py)
    assert set(DASHBOARD_NAMES) <= exported.keys()
    hpa = one(docs, "HorizontalPodAutoscaler", MMGATE)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": MMGATE,
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "mmgate_inference_active_requests"
    assert exported[name] == "gauge"
    # the Prometheus adapter serves that name from that series
    adapter = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["name"]["as"] == name
    monitor = one(docs, "ServiceMonitor", MMGATE)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    svc = one(docs, "Service", MMGATE)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert container_port(mmgate_container(docs), port["targetPort"]) == settings.metrics.port


def test_destination_rule_hashes_the_affinity_header(docs: list[Doc]) -> None:
    rule = one(docs, "DestinationRule", MMGATE)
    svc = one(docs, "Service", MMGATE)
    assert rule["spec"]["host"] == f"{MMGATE}.{svc['metadata']['namespace']}.svc.cluster.local"
    policy = rule["spec"]["trafficPolicy"]
    hashing = policy["loadBalancer"]["consistentHash"]
    assert hashing["httpHeaderName"] == AFFINITY_HEADER
    assert {"ringHash", "maglev"} & hashing.keys()
    outliers = policy["outlierDetection"]
    assert outliers["consecutiveGatewayErrors"] > 0
    assert 0 < outliers["maxEjectionPercent"] < 100


def test_bounded_loads_filter_sets_the_factor_on_the_destination_rules_cluster(
    docs: list[Doc],
) -> None:
    """deploy/k8s/mesh-bounded-loads: the EnvoyFilter that adds Envoy's hash_balance_factor,
    which Istio's DestinationRule lacks, to the cluster of mmgate's gRPC port, for the callers'
    sidecars and gateways, from Istio's root namespace."""
    (envoy_filter,) = render(K8S / "mesh-bounded-loads")
    EnvoyFilter.model_validate(envoy_filter, extra="forbid")
    assert envoy_filter["metadata"]["namespace"] == "istio-system"
    rule = one(docs, "DestinationRule", MMGATE)
    port = one(docs, "Service", MMGATE)["spec"]["ports"][0]
    assert port["appProtocol"] == "grpc"
    patches = envoy_filter["spec"]["configPatches"]
    assert {p["match"]["context"] for p in patches} == {"SIDECAR_OUTBOUND", "GATEWAY"}
    for patch in patches:
        assert patch["applyTo"] == "CLUSTER"
        assert patch["match"]["cluster"] == {
            "service": rule["spec"]["host"],
            "portNumber": port["port"],
        }
        assert patch["patch"]["operation"] == "MERGE"
        hashing = patch["patch"]["value"]["common_lb_config"]["consistent_hashing_lb_config"]
        # Envoy takes 100 (no bound) and up; the real-process test uses the same factor
        assert hashing == {"hash_balance_factor": BALANCE_FACTOR}


def prestop_seconds(c: Doc) -> int:
    handler = c["lifecycle"]["preStop"]
    if "sleep" in handler:
        return int(handler["sleep"]["seconds"])
    command = handler["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


def test_termination_covers_the_drain(docs: list[Doc], settings: Settings) -> None:
    deployment = one(docs, "Deployment", MMGATE)
    pod = deployment["spec"]["template"]
    prestop = prestop_seconds(mmgate_container(docs))
    assert prestop > 0
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.shutdown_grace_seconds + prestop
    # the sidecar drains for as long as mmgate may, and is itself done within the pod's grace
    proxy = yaml.safe_load(pod["metadata"]["annotations"]["proxy.istio.io/config"])
    assert proxy["holdApplicationUntilProxyStarts"] is True
    drain = proxy["terminationDrainDuration"]
    assert drain.endswith("s")
    assert settings.shutdown_grace_seconds + prestop <= int(drain[:-1]) < grace


def test_pods_run_unprivileged(overlay: str, docs: list[Doc], settings: Settings) -> None:
    pod = one(docs, "Deployment", MMGATE)["spec"]["template"]["spec"]
    image_env, image_user = image_config(DOCKERFILES[overlay])
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the image's own user: what it owns (its prepared model) is the pod's
    user, _, group = image_user.partition(":")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(user),
        int(group),
    )
    assert pod.get("hostNetwork", False) is False  # mesh mode: no way around the sidecar
    for deployment in find(docs, "Deployment"):
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            context = c["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, c["name"]
            assert context["allowPrivilegeEscalation"] is False, c["name"]
            assert context["capabilities"]["drop"] == ["ALL"], c["name"]
    # the model is read where the image's build prepared it (a prepared model is only read);
    # what mmgate and its libraries write, under HOME and /tmp, goes to emptyDir volumes
    assert settings.model_cache == Path(image_env["MMGATE_MODEL_CACHE"])
    c = mmgate_container(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = [
        Path(m["mountPath"])
        for m in c["volumeMounts"]
        if "emptyDir" in volumes[m["name"]] and not m.get("readOnly", False)
    ]
    home = Path(env_of(docs, c).get("HOME", image_env["HOME"]))
    for path in (home, Path("/tmp")):
        assert any(path.is_relative_to(mount) for mount in writable), path
    assert {"tokens", "tls"} <= {m["name"] for m in c["volumeMounts"]}
    assert volumes["tokens"]["secret"]["secretName"] == "mmgate-tokens"


def test_topology_spread_and_disruption_budget(docs: list[Doc]) -> None:
    deployment = one(docs, "Deployment", MMGATE)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = one(docs, "PodDisruptionBudget", MMGATE)
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_mesh_policies_admit_exactly_the_mapped_identities(
    docs: list[Doc], settings: Settings
) -> None:
    # mesh mode believes x-forwarded-client-cert only where every call comes through the pod's
    # own sidecar (docs/security.md): injected, the app port not excluded, mTLS STRICT
    namespace = one(docs, "Namespace", MMGATE)
    assert namespace["metadata"]["labels"]["istio-injection"] == "enabled"
    pod = one(docs, "Deployment", MMGATE)["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations.get("sidecar.istio.io/inject", "true") == "true"
    excluded = annotations.get("traffic.sidecar.istio.io/excludeInboundPorts", "")
    assert str(settings.port) not in excluded.split(",")
    # the header is believed only from the sidecar's own address: in REDIRECT mode (no TPROXY
    # annotation), Istio's inbound connections come from 127.0.0.6 / ::6, and nothing else may
    # be listed (a pod CIDR would admit callers around the sidecar)
    assert annotations.get("sidecar.istio.io/interceptionMode", "REDIRECT") == "REDIRECT"
    assert {str(n) for n in settings.auth.sidecar_peers} == {"127.0.0.6/32", "::6/128"}
    assert settings.auth.sidecar_xfcc == "append_forward"  # Istio's sidecar default
    assert settings.host == "0.0.0.0"  # the sidecar forwards to the pod's address
    peer = one(docs, "PeerAuthentication", MMGATE)
    assert peer["spec"]["mtls"]["mode"] == "STRICT"
    assert peer["spec"]["portLevelMtls"] == {str(settings.metrics.port): {"mode": "PERMISSIVE"}}
    policy = one(docs, "AuthorizationPolicy", MMGATE)
    assert policy["spec"]["action"] == "ALLOW"
    grants: dict[str, Grant] = {}
    served = served_services()
    for rule in policy["spec"]["rules"]:
        (operation,) = [to["operation"] for to in rule["to"]]
        paths = operation["paths"]
        if operation["ports"] == [str(settings.metrics.port)]:
            assert "from" not in rule
            assert paths == ["/metrics"]
            continue
        assert operation["ports"] == [str(settings.port)]
        for path in paths:
            service, _, method = path.strip("/").partition("/")
            assert service in served, path
            assert method == "*", path
        for source in rule["from"]:
            for principal in source["source"]["principals"]:
                # the same identity mmgate maps to a tenant: spiffe://<trust domain>/ns/../sa/..
                grant = settings.auth.identities.get(f"spiffe://{principal}")
                assert grant is not None, f"{principal} reaches mmgate but has no tenant"
                grants[principal] = grant
                assert f"/{INFERENCE}/*" in paths
                if f"/{CACHE}/*" in paths:
                    assert grant.role == "admin", f"{principal} calls Cache without admin"
    assert {f"spiffe://{p}" for p in grants} == settings.auth.identities.keys()


def test_network_policies_admit_mmgate_to_redis_and_the_monitoring_namespace(
    docs: list[Doc], settings: Settings
) -> None:
    labels = one(docs, "Deployment", MMGATE)["spec"]["template"]["metadata"]["labels"]
    assert settings.redis.url is not None
    host_port = settings.redis.url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    entry, redis = service_port(docs, host, int(port))
    redis_port = container_port(redis, entry["targetPort"])
    (policy,) = [
        p
        for p in find(docs, "NetworkPolicy")
        if p["spec"]["podSelector"]["matchLabels"].items()
        <= one(docs, "Service", host)["spec"]["selector"].items()
    ]
    admitted = [rule for rule in policy["spec"]["ingress"] if redis_port in ports_of(rule)]
    assert admitted
    for rule in admitted:
        (peer,) = rule["from"]
        assert peer["podSelector"]["matchLabels"].items() <= labels.items()
    own = one(docs, "NetworkPolicy", MMGATE)
    assert own["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    for rule in own["spec"]["ingress"]:
        if settings.metrics.port in ports_of(rule):
            assert [p["namespaceSelector"] for p in rule["from"]] == [
                {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
            ]
        if settings.port in ports_of(rule):
            assert "from" not in rule  # identity decides, in the mesh


def ports_of(rule: Doc) -> set[int]:
    return {p["port"] for p in rule["ports"]}


def test_traces_go_to_jaegers_otlp_port(docs: list[Doc], settings: Settings) -> None:
    assert settings.tracing.endpoint is not None
    assert settings.tracing.protocol in (None, "grpc")
    host, _, port = settings.tracing.endpoint.rpartition(":")
    assert "://" not in host  # grpc host:port, plaintext (the sidecars encrypt it)
    entry, jaeger = service_port(docs, host, int(port))
    assert entry["appProtocol"] == "grpc"
    assert container_port(jaeger, entry["targetPort"]) == 4317
    env = env_of(docs, jaeger)
    assert env["COLLECTOR_OTLP_ENABLED"] == "true"
    assert {4317, 4318, 16686} <= {p["containerPort"] for p in jaeger["ports"]}


def test_dashboard_is_a_configmap_for_grafanas_sidecar(docs: list[Doc]) -> None:
    (dashboard,) = [
        d
        for d in find(docs, "ConfigMap")
        if d["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = (ROOT / "deploy" / "grafana" / "mmgate.json").read_text()
    assert dashboard["data"] == {"mmgate.json": text}


def test_token_mode_component_renders_and_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an overlay of one's own, as docs/deploy.md shows it (kustomize wants relative paths)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "overlays" / "cpu", tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "token-auth", tmp_path)],
            }
        )
    )
    docs = render(tmp_path)
    c = mmgate_container(docs)
    settings = settings_from(env_of(docs, c), monkeypatch)
    assert settings.auth.mode == "token"
    assert settings.auth.tokens_file is not None
    (mount,) = [
        m for m in c["volumeMounts"] if settings.auth.tokens_file.is_relative_to(m["mountPath"])
    ]
    pod = one(docs, "Deployment", MMGATE)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = one(docs, "Secret", volume["secret"]["secretName"])
    key = str(settings.auth.tokens_file.relative_to(mount["mountPath"]))
    tokens = json.loads(base64.b64decode(secret["data"][key]))
    assert isinstance(tokens, dict)
    for grant in tokens.values():
        Grant.model_validate(grant)
    for version in KUBERNETES_VERSIONS:
        assert kubernetes_problem(one(docs, "Deployment", MMGATE), version) is None


# ── 4. the generated PrometheusRule ───────────────────────────────────────────────────────


def test_prometheus_rule_is_current() -> None:
    generator = load_generator()
    committed = (K8S / "base" / "prometheusrule.yaml").read_text()
    assert generator.render() == committed, "run `make manifests` and commit the result"


def test_prometheus_rule_carries_every_rule_file(docs: list[Doc]) -> None:
    rule_files = sorted((ROOT / "deploy" / "prometheus").glob("*_rules.yml"))
    assert len(rule_files) == 2
    groups = [g for path in rule_files for g in yaml.safe_load(path.read_text())["groups"]]
    assert one(docs, "PrometheusRule", MMGATE)["spec"]["groups"] == groups
