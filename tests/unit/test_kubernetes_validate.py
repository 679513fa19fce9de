"""deploy/kubernetes/ against the real schemas: Kubernetes' own (kubernetes-validate, strict:
no unknown field) for the core objects, and the LeaderWorkerSet CRD's openAPIV3Schema of the
LWS release (tests/data/lws/, vendored) for the LeaderWorkerSet, unknown fields refused as
`kubectl apply --validate=strict` refuses them. Both checks are shown to fail on a broken
copy first."""

from __future__ import annotations

import copy
import gzip
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
LWS_CRD = ROOT / "tests" / "data" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"
K8S_VERSION = "1.33.0"  # a release every current cluster serves; the schemas are the package's


def docs() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, d) for p in MANIFESTS for d in yaml.safe_load_all(p.read_text())]


def core_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(n, d) for n, d in docs() if d["kind"] != "LeaderWorkerSet"]


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused wherever the CRD lists the fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def lws_schema() -> dict[str, Any]:
    crd = yaml.safe_load(gzip.decompress(LWS_CRD.read_bytes()))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(v1["schema"]["openAPIV3Schema"])
    # metadata is the apiserver's business (ObjectMeta), not the CRD's
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate_lws(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, lws_schema(), cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize(("name", "doc"), core_docs(),
                         ids=[f"{n}:{d['kind']}" for n, d in core_docs()])
def test_core_objects_validate_strictly(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_core_validator_refuses_an_unknown_field() -> None:
    (deployment,) = [d for _, d in docs() if d["kind"] == "Deployment"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_leaderworkerset_validates_against_the_lws_crd() -> None:
    (lws,) = [d for _, d in docs() if d["kind"] == "LeaderWorkerSet"]
    validate_lws(lws)
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "readinesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(broken)
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"  # not an LWS policy
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(broken)
