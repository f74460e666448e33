"""deploy/k8s/inference-pool, checked offline: it renders; its built-in kinds validate strictly;
the InferencePool and the HTTPRoute validate against the released CRDs pinned in tests/deploy/crds
(unknown fields refused); its parts name each other right; and every metric the endpoint picker
is configured to read is one a running mmgate exports, with the labels the picker reads.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml  # type: ignore[import-untyped]

from services.models import build_tiny_model
from tests.deploy.test_manifests import (
    CUSTOM_RESOURCES,
    K8S,
    KUBERNETES_VERSIONS,
    MMGATE,
    Doc,
    container,
    is_built_in,
    kubernetes_problem,
    one,
    render,
)
from tests.services.api.synthetic_server import synthetic_server
from tests.services.prom import scrape

CRDS = Path(__file__).with_name("crds")
# the released CRDs the variant is written against, by (apiVersion, kind)
PINNED = {
    ("inference.networking.k8s.io/v1", "InferencePool"): (
        CRDS / "inferencepools-gateway-api-inference-extension-v1.5.0.yaml"
    ),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): (
        CRDS / "httproutes-gateway-api-v1.3.0-standard.yaml"
    ),
}
PICKER = "mmgate-endpoint-picker"
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render(K8S / "inference-pool")


def closed(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused, as the API server prunes (and, with field
    validation strict, refuses) them: every object that lists its properties takes no others."""
    if isinstance(schema, dict):
        schema = {key: closed(value) for key, value in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    return schema


def validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load(PINNED[api_version, kind].read_text())
    assert crd["spec"]["names"]["kind"] == kind
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert served["served"]
    schema = closed(served["schema"]["openAPIV3Schema"])
    # metadata is the API server's to check (the CRD leaves it open)
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft202012Validator(schema)


def problems(doc: Doc) -> Iterator[str]:
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    for error in validator(doc["apiVersion"], doc["kind"]).iter_errors(doc):
        yield f"{name}: {'.'.join(map(str, error.path))}: {error.message}"


def test_the_variant_renders_the_pool_its_picker_and_its_route_beside_mmgate(
    docs: list[Doc],
) -> None:
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert set(PINNED) <= kinds
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"} >= {MMGATE, PICKER}
    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == {MMGATE}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_its_built_in_kinds_validate_strictly(docs: list[Doc], version: str) -> None:
    built_in = [d for d in docs if is_built_in(d) and (d["apiVersion"], d["kind"]) not in PINNED]
    found = [p for d in built_in if (p := kubernetes_problem(d, version)) is not None]
    assert found == []


def test_the_pool_and_the_route_validate_against_the_pinned_crds(docs: list[Doc]) -> None:
    pinned = [d for d in docs if (d["apiVersion"], d["kind"]) in PINNED]
    assert len(pinned) == 2
    assert [p for d in pinned for p in problems(d)] == []
    # the other custom resources as the overlays' are checked
    for doc in docs:
        if not is_built_in(doc) and (doc["apiVersion"], doc["kind"]) not in PINNED:
            CUSTOM_RESOURCES[doc["apiVersion"], doc["kind"]].model_validate(doc, extra="forbid")


def test_a_misspelled_or_unknown_value_is_refused(docs: list[Doc]) -> None:
    pool = copy.deepcopy(one(docs, "InferencePool", MMGATE))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    assert any("targetPort" in p for p in problems(pool))
    pool = copy.deepcopy(one(docs, "InferencePool", MMGATE))
    pool["spec"]["appProtocol"] = "grpc"  # not one the released CRD takes
    assert any("appProtocol" in p for p in problems(pool))
    route = copy.deepcopy(one(docs, "HTTPRoute", MMGATE))
    route["spec"]["rules"][0]["backendRef"] = route["spec"]["rules"][0].pop("backendRefs")
    assert any("backendRef" in p for p in problems(route))


def test_the_pool_its_picker_and_the_route_name_each_other(docs: list[Doc]) -> None:
    pool = one(docs, "InferencePool", MMGATE)["spec"]
    mmgate = one(docs, "Deployment", MMGATE)
    pod_labels = mmgate["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels[ENGINE_LABEL] == "mmgate"
    grpc_port = next(
        p["containerPort"] for p in container(mmgate, MMGATE)["ports"] if p["name"] == "grpc-mmgate"
    )
    assert pool["targetPorts"] == [{"number": grpc_port}]
    assert pool["appProtocol"] == "kubernetes.io/h2c"

    picker = one(docs, "Deployment", PICKER)
    args = container(picker, "epp")["args"]
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--pool-name"] == MMGATE
    assert flags["--pool-namespace"] == MMGATE
    metrics_port = next(
        p["containerPort"]
        for p in container(mmgate, MMGATE)["ports"]
        if p["name"] == "http-metrics"
    )
    assert flags["--model-server-metrics-port"] == str(metrics_port)
    service = one(docs, "Service", pool["endpointPickerRef"]["name"])
    assert pool["endpointPickerRef"]["port"]["number"] in {
        p["port"] for p in service["spec"]["ports"]
    }
    assert (
        service["spec"]["selector"].items()
        <= picker["spec"]["template"]["metadata"]["labels"].items()
    )
    # v1.5.0 refuses its metric flags: the names come from the configuration file only
    assert not [a for a in args if a.endswith("-metric") or "-metric=" in a]
    route = one(docs, "HTTPRoute", MMGATE)["spec"]
    backends = [b for rule in route["rules"] for b in rule["backendRefs"]]
    assert backends == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": MMGATE}
    ]


def picker_config(docs: list[Doc]) -> dict[str, Any]:
    picker = one(docs, "Deployment", PICKER)
    args = container(picker, "epp")["args"]
    path = Path(args[args.index("--config-file") + 1])
    (volume,) = picker["spec"]["template"]["spec"]["volumes"]
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    mount = container(picker, "epp")["volumeMounts"][0]["mountPath"]
    assert str(path.parent) == mount
    config: dict[str, Any] = yaml.safe_load(config_map["data"][path.name])
    return config


def metric_specs(config: dict[str, Any]) -> dict[str, str]:
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    parameters = extractor["parameters"]
    (engine,) = [e for e in parameters["engineConfigs"] if e["name"] == parameters["defaultEngine"]]
    return {key: spec for key, spec in engine.items() if key.endswith("Spec") and spec}


async def test_every_metric_the_picker_reads_is_exported_by_a_running_mmgate(
    docs: list[Doc], tmp_path: Path
) -> None:
    tiny_model = str(build_tiny_model(tmp_path / "tiny"))
    specs = metric_specs(picker_config(docs))
    assert set(specs) == {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec"}
    async with synthetic_server(tiny_model, tmp_path, step_seconds=0.005) as (server, _):
        scraped = await scrape(f"http://127.0.0.1:{server.metrics.port}/metrics")
    for key, spec in specs.items():
        name = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?", spec)
        assert name is not None, spec
        assert scraped.types.get(name.group(1)) == "gauge", f"{key}: {spec} is not exported"
    lora = [labels for (name, labels) in scraped.samples if name == specs["loraSpec"]]
    assert len(lora) == 1
    assert {key for key, _ in lora[0]} == {
        "running_lora_adapters",
        "waiting_lora_adapters",
        "max_lora",
    }
