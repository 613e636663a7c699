"""deploy/k8s: valid against the Kubernetes schemas, and in step with the code and images.

Built-in kinds are checked offline with kubernetes-validate (PyPI; it carries
the schemas of each Kubernetes release), strictly, so an unknown field is an
error. KEDA's ScaledObject and TriggerAuthentication are custom resources it
has no schema for: a JSON schema below, written from KEDA's v2 CRDs, checks
their structure, and the tests check what they point at.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml

from funnel.common.contracts.keys import Keys
from funnel.common.store import list_models
from funnel.worker.settings import model_and_version
from tests.deploy.support import K8S, k8s_documents, setting_names, target_stage

KUBERNETES_VERSIONS = ["1.29", "1.37"]  # the oldest and newest this is meant for
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
SENTINEL_EXAMPLE = "keda-sentinel.example.yaml"  # the scalers for Redis behind Sentinel, applied instead
CLUSTER_EXAMPLE = "keda-cluster.example.yaml"  # the scalers for a Redis Cluster, applied instead
MANY_EXAMPLE = "worker-many.example.yaml"  # one worker for every model, applied in place of per-model workers
EXAMPLES = {"redis-secret.example.yaml", SENTINEL_EXAMPLE, CLUSTER_EXAMPLE, MANY_EXAMPLE}  # never applied


def resources() -> list[tuple[str, dict]]:
    return [(name, doc) for name, docs in k8s_documents().items() if name not in ("kustomization.yaml",
                                                                                   SENTINEL_EXAMPLE, CLUSTER_EXAMPLE,
                                                                                   MANY_EXAMPLE)
            for doc in docs]


def sentinel_example(kind: str, example: str = SENTINEL_EXAMPLE) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in k8s_documents()[example] if doc["kind"] == kind}


def cluster_example(kind: str) -> dict[str, dict]:
    return sentinel_example(kind, CLUSTER_EXAMPLE)


def of_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in resources() if doc["kind"] == kind}


def containers(deployment: dict) -> list[dict]:
    return deployment["spec"]["template"]["spec"]["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def workers() -> dict[str, dict]:
    return {name: d for name, d in of_kind("Deployment").items()
            if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"}


def model_of(deployment: dict) -> tuple[str, int | None]:
    """The model and version a worker Deployment serves (FUNNEL_MODEL, NAME or NAME:N)."""
    return model_and_version(env_of(containers(deployment)[0])["FUNNEL_MODEL"]["value"])


# ---------------------------------------------------------------------------
# Schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_kinds_validate_strictly(version):
    checked = 0
    for name, doc in resources():
        if doc["kind"] in KEDA_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")
        checked += 1
    assert checked >= 7


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_many_models_worker_validates_and_serves_every_model(version):
    (deployment,) = k8s_documents()[MANY_EXAMPLE]
    kubernetes_validate.validate(deployment, version, strict=True)
    (container,) = containers(deployment)
    env = {name: entry.get("value") for name, entry in env_of(container).items()}
    assert env["FUNNEL_MODELS"] == "*" and "FUNNEL_MODEL" not in env
    assert int(env["FUNNEL_MAX_RESIDENT"]) >= 1 and float(env["FUNNEL_MAX_RESIDENT_MB"]) > 0
    assert env["FUNNEL_DEVICE"] == "cuda:0" and container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert set(env) <= setting_names()["worker"], set(env)


def test_the_validator_catches_mistakes():
    bad = of_kind("Deployment")["funnel-web"]
    containers(bad)[0]["livenessProbes"] = containers(bad)[0].pop("livenessProbe")  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)


STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
REDIS_METADATA = {"address", "addressFromEnv", "host", "hostFromEnv", "port", "portFromEnv",
                  "username", "usernameFromEnv", "passwordFromEnv", "listName", "listLength",
                  "activationListLength", "databaseIndex", "enableTLS", "unsafeSsl"}
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                   "properties": {"name": {"type": "string"},
                                                  "apiVersion": {"type": "string"},
                                                  "kind": {"type": "string"},
                                                  "envSourceContainerName": {"type": "string"}}},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {"type": "object"},
                "advanced": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"name": {"type": "string"}, "behavior": {"type": "object"}}},
                        "scalingModifiers": {"type": "object"}}},
                "triggers": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": STRING_MAP,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {
                                "type": "object", "required": ["name"], "additionalProperties": False,
                                "properties": {"name": {"type": "string"},
                                               "kind": {"enum": ["TriggerAuthentication",
                                                                 "ClusterTriggerAuthentication"]}}}}}}}}},
}
TRIGGER_AUTHENTICATION = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "items": {"type": "object", "required": ["parameter", "name", "key"],
                              "additionalProperties": False,
                              "properties": {"parameter": {"type": "string"}, "name": {"type": "string"},
                                             "key": {"type": "string"}}}},
                "env": {"type": "array"}, "podIdentity": {"type": "object"},
                "configMapTargetRef": {"type": "array"}, "hashiCorpVault": {"type": "object"}}}},
}
REDIS_AUTH_PARAMETERS = {"address", "host", "port", "username", "password", "tls", "ca", "cert", "key",
                         "keyPassword"}
# KEDA's redis-sentinel trigger (its docs, "Redis Lists (supports Redis Sentinel)").
SENTINEL_METADATA = {"addresses", "addressesFromEnv", "hosts", "hostsFromEnv", "ports", "portsFromEnv",
                     "usernameFromEnv", "passwordFromEnv", "sentinelUsernameFromEnv", "sentinelPasswordFromEnv",
                     "sentinelMaster", "sentinelMasterFromEnv", "listName", "listLength", "activationListLength",
                     "databaseIndex", "enableTLS", "unsafeSsl"}
SENTINEL_AUTH_PARAMETERS = {"addresses", "hosts", "ports", "sentinelMaster", "username", "password",
                            "sentinelUsername", "sentinelPassword", "tls", "ca", "cert", "key", "keyPassword"}
# KEDA's redis-cluster trigger (its docs, "Redis Lists (supports Redis Cluster)"): no database index.
CLUSTER_METADATA = {"addresses", "addressesFromEnv", "hosts", "hostsFromEnv", "ports", "portsFromEnv",
                    "usernameFromEnv", "passwordFromEnv", "listName", "listLength", "activationListLength",
                    "enableTLS", "unsafeSsl"}
CLUSTER_AUTH_PARAMETERS = {"addresses", "hosts", "ports", "username", "password", "tls", "ca", "cert", "key",
                           "keyPassword"}


def test_keda_resources_have_keda_structure():
    scaled = of_kind("ScaledObject")
    auths = of_kind("TriggerAuthentication")
    assert scaled and auths
    for doc in scaled.values():
        jsonschema.validate(doc, SCALED_OBJECT)
        for trigger in doc["spec"]["triggers"]:
            assert trigger["type"] == "redis"
            assert set(trigger["metadata"]) <= REDIS_METADATA, set(trigger["metadata"]) - REDIS_METADATA
            assert int(trigger["metadata"]["listLength"]) > 0
            assert trigger["authenticationRef"]["name"] in auths
        # The HPA behavior KEDA passes on is a Kubernetes type: check it with the Kubernetes schema.
        behavior = doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "check"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 2,
                        "behavior": behavior}}
        kubernetes_validate.validate(hpa, KUBERNETES_VERSIONS[-1], strict=True)
        assert doc["spec"]["minReplicaCount"] >= 1  # the web's requests need a worker to wake anything
        assert doc["spec"]["maxReplicaCount"] >= doc["spec"]["minReplicaCount"]
    for doc in auths.values():
        jsonschema.validate(doc, TRIGGER_AUTHENTICATION)
        assert {r["parameter"] for r in doc["spec"]["secretTargetRef"]} <= REDIS_AUTH_PARAMETERS


def test_the_keda_schema_catches_mistakes():
    doc = yaml.safe_load(yaml.safe_dump(next(iter(of_kind("ScaledObject").values()))))
    doc["spec"]["triggers"][0]["authRef"] = doc["spec"]["triggers"][0].pop("authenticationRef")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCALED_OBJECT)


def test_sentinel_scalers_have_keda_structure():
    auths = sentinel_example("TriggerAuthentication")
    secret = next(d for d in k8s_documents()["redis-secret.example.yaml"] if d["kind"] == "Secret")
    for auth in auths.values():
        jsonschema.validate(auth, TRIGGER_AUTHENTICATION)
        refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
        assert set(refs) <= SENTINEL_AUTH_PARAMETERS, set(refs) - SENTINEL_AUTH_PARAMETERS
        assert {"addresses", "sentinelMaster"} <= set(refs)  # where the Sentinels are, which service
        for ref in refs.values():
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    scaled = sentinel_example("ScaledObject")
    assert scaled
    for doc in scaled.values():
        jsonschema.validate(doc, SCALED_OBJECT)
        for trigger in doc["spec"]["triggers"]:
            assert trigger["type"] == "redis-sentinel"
            assert set(trigger["metadata"]) <= SENTINEL_METADATA, set(trigger["metadata"]) - SENTINEL_METADATA
            assert trigger["authenticationRef"]["name"] in auths


def test_sentinel_scalers_replace_the_default_ones_trigger_for_trigger():
    """Same names, targets and scaling as the ScaledObjects they replace; the same list and lengths."""
    defaults, sentinel = of_kind("ScaledObject"), sentinel_example("ScaledObject")
    assert set(sentinel) == set(defaults)
    for name, doc in sentinel.items():
        default = defaults[name]
        assert {k: v for k, v in doc["spec"].items() if k != "triggers"} == \
            {k: v for k, v in default["spec"].items() if k != "triggers"}
        for mine, theirs in zip(doc["spec"]["triggers"], default["spec"]["triggers"], strict=True):
            assert mine["metadata"] == theirs["metadata"], name


def test_the_secret_examples_sentinel_url_matches_its_keda_keys():
    from funnel.common.link.connection import parse_sentinel_url

    text = (K8S / "redis-secret.example.yaml").read_text()
    (url,) = set(re.findall(r"url='(redis\+sentinel://[^']+)'", text))
    (addresses,) = set(re.findall(r"sentinel-addresses='([^']+)'", text))
    (service,) = set(re.findall(r"sentinel-master='([^']+)'", text))
    parsed = parse_sentinel_url(url)
    assert [f"{host}:{port}" for host, port in parsed.sentinels] == addresses.split(",")
    assert parsed.service == service and parsed.primary["db"] == 0  # databaseIndex "0" in the scalers
    secret = next(d for d in k8s_documents()["redis-secret.example.yaml"] if d["kind"] == "Secret")
    assert secret["stringData"]["sentinel-addresses"] == addresses


def test_cluster_scalers_have_keda_structure():
    auths = cluster_example("TriggerAuthentication")
    secret = next(d for d in k8s_documents()["redis-secret.example.yaml"] if d["kind"] == "Secret")
    assert auths
    for auth in auths.values():
        jsonschema.validate(auth, TRIGGER_AUTHENTICATION)
        refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
        assert set(refs) <= CLUSTER_AUTH_PARAMETERS, set(refs) - CLUSTER_AUTH_PARAMETERS
        assert "addresses" in refs  # where the cluster's nodes are
        for ref in refs.values():
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    scaled = cluster_example("ScaledObject")
    assert scaled
    for doc in scaled.values():
        jsonschema.validate(doc, SCALED_OBJECT)
        for trigger in doc["spec"]["triggers"]:
            assert trigger["type"] == "redis-cluster"
            assert set(trigger["metadata"]) <= CLUSTER_METADATA, set(trigger["metadata"]) - CLUSTER_METADATA
            assert trigger["authenticationRef"]["name"] in auths


def test_cluster_scalers_replace_the_default_ones_trigger_for_trigger():
    """Same names, targets and scaling as the ScaledObjects they replace; the same list and lengths."""
    defaults, cluster = of_kind("ScaledObject"), cluster_example("ScaledObject")
    assert set(cluster) == set(defaults)
    for name, doc in cluster.items():
        default = defaults[name]
        assert {k: v for k, v in doc["spec"].items() if k != "triggers"} == \
            {k: v for k, v in default["spec"].items() if k != "triggers"}
        for mine, theirs in zip(doc["spec"]["triggers"], default["spec"]["triggers"], strict=True):
            assert mine["metadata"] == {k: v for k, v in theirs["metadata"].items() if k != "databaseIndex"}, name


def test_the_secret_examples_cluster_url_matches_its_keda_keys():
    from funnel.common.link.connection import parse_cluster_url

    text = (K8S / "redis-secret.example.yaml").read_text()
    (url,) = set(re.findall(r"url='(redis\+cluster://[^']+)'", text))
    (addresses,) = set(re.findall(r"cluster-addresses='([^']+)'", text))
    assert [f"{host}:{port}" for host, port in parse_cluster_url(url).nodes] == addresses.split(",")
    secret = next(d for d in k8s_documents()["redis-secret.example.yaml"] if d["kind"] == "Secret")
    assert secret["stringData"]["cluster-addresses"] == addresses


# ---------------------------------------------------------------------------
# In step with the code


def test_one_worker_deployment_and_scaler_per_model(model_store):
    models = set(list_models(str(model_store)))
    deployed = {model_of(d)[0]: name for name, d in workers().items()}
    assert set(deployed) == models
    targets = {s["spec"]["scaleTargetRef"]["name"] for s in of_kind("ScaledObject").values()}
    assert targets == set(deployed.values())


def scaled_lists(scaled: dict) -> tuple[list[str], list[str]]:
    """What a ScaledObject's triggers watch, and every list its Deployment's workers take from."""
    deployment = workers()[scaled["spec"]["scaleTargetRef"]["name"]]
    env = env_of(containers(deployment)[0])
    prefix = env["FUNNEL_PREFIX"]["value"] if "FUNNEL_PREFIX" in env else Keys().prefix
    model, version = model_of(deployment)
    assert version is not None, f"{model}: a worker Deployment pins its version, which its triggers name"
    return [t["metadata"]["listName"] for t in scaled["spec"]["triggers"]], Keys(prefix).taken_from(model, version)


def test_keda_triggers_watch_every_list_the_workers_take_from(model_store):
    for name, doc in of_kind("ScaledObject").items():
        watched, taken_from = scaled_lists(doc)
        assert watched == taken_from, name


def desired_replicas(client: redis.Redis, scaled: dict) -> tuple[int, bool]:
    """What KEDA makes of a ScaledObject's redis triggers against this Redis: each trigger's metric is
    LLEN of its list, the HPA wants ceil(metric / listLength) replicas of each and takes the largest
    (within min and max); the Deployment is active (scaled up from zero) while any metric is over its
    activationListLength (0 by default)."""
    spec = scaled["spec"]
    wanted, active = 0, False
    for trigger in spec["triggers"]:
        metric = client.llen(trigger["metadata"]["listName"])
        wanted = max(wanted, -(-metric // int(trigger["metadata"]["listLength"])))
        active = active or metric > int(trigger["metadata"].get("activationListLength", "0"))
    return min(max(wanted, spec.get("minReplicaCount", 0)), spec["maxReplicaCount"]), active


def test_a_backlog_in_any_list_scales_its_workers_and_wakes_them_from_zero(redis_client):
    """Applied to a live Redis: a backlog of two replicas' worth in any one lane or the bulk queue,
    and nothing elsewhere, asks for two replicas; one job there wakes a Deployment scaled to zero."""
    for name, doc in of_kind("ScaledObject").items():
        watched, taken_from = scaled_lists(doc)
        for trigger, key in zip(doc["spec"]["triggers"], taken_from, strict=True):
            redis_client.flushall()
            assert desired_replicas(redis_client, doc) == (doc["spec"]["minReplicaCount"], False)
            redis_client.lpush(key, b"job")
            assert desired_replicas(redis_client, doc)[1], (name, key)
            redis_client.lpush(key, *[b"job"] * (2 * int(trigger["metadata"]["listLength"]) - 1))
            assert desired_replicas(redis_client, doc) == (2, True), (name, key)
    redis_client.flushall()


def test_every_funnel_variable_is_a_setting():
    names = setting_names()
    for name, deployment in of_kind("Deployment").items():
        kind = "worker" if name in workers() else "grpc" if name == "funnel-grpc" else "web"
        for container in containers(deployment):
            funnel = {n for n in env_of(container) if n.startswith("FUNNEL_")}
            assert funnel <= names[kind], (name, funnel - names[kind])
    # Variables mentioned anywhere else under deploy/k8s too (comments included).
    for path in K8S.glob("*.yaml"):
        for var in re.findall(r"FUNNEL_[A-Z0-9_]+", path.read_text()):
            assert var in names["web"] | names["grpc"] | names["worker"], (path.name, var)


def test_workers_have_a_gpu_and_the_images_healthcheck():
    healthcheck = target_stage("deploy/Dockerfile.worker", "cuda").healthcheck
    assert healthcheck == ["python", "/app/healthcheck.py"]
    for name, deployment in workers().items():
        (container,) = containers(deployment)
        resources = container["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1, name
        assert resources["requests"].get("nvidia.com/gpu", 1) == resources["limits"]["nvidia.com/gpu"]
        assert "cpu" in resources["requests"] and "memory" in resources["limits"]
        assert env_of(container)["FUNNEL_DEVICE"]["value"] == "cuda:0"  # the pod's one GPU
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["exec"]["command"] == healthcheck, (name, probe)
        assert "replicas" not in deployment["spec"], f"{name}: KEDA owns the replica count"


def test_web_service_probes_and_redis_secret():
    assert set(of_kind("Deployment")) - set(workers()) == {"funnel-web", "funnel-grpc"}
    web = of_kind("Deployment")["funnel-web"]
    (container,) = containers(web)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(target_stage("deploy/Dockerfile.web", None).env["FUNNEL_PORT"])}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    pod_labels = web["spec"]["template"]["metadata"]["labels"]
    assert web["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert set(of_kind("Service")) == {"funnel-web", "funnel-grpc"}
    service = of_kind("Service")["funnel-web"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    assert "resources" in container and "limits" in container["resources"]

    secret = next(d for d in k8s_documents()["redis-secret.example.yaml"] if d["kind"] == "Secret")
    keys = set(secret["stringData"])
    for deployment in of_kind("Deployment").values():
        ref = env_of(containers(deployment)[0])["FUNNEL_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys
        for e in env_of(containers(deployment)[0]).values():  # any other required secret is this one
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for auth in of_kind("TriggerAuthentication").values():
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys
    assert secret["stringData"]["url"].startswith(("redis://", "rediss://"))


def test_grpc_service_runs_the_web_image_on_its_port():
    """funnel-grpc: the web image's other console script, on FUNNEL_GRPC_PORT, exposed as gRPC."""
    from funnel.web.grpc.settings import GrpcSettings

    grpc = of_kind("Deployment")["funnel-grpc"]
    (container,) = containers(grpc)
    assert container["image"] == containers(of_kind("Deployment")["funnel-web"])[0]["image"]
    assert container["command"] == ["funnel-grpc"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": GrpcSettings.grpc_port}
    assert env_of(container)["FUNNEL_GRPC_PORT"]["value"] == str(GrpcSettings.grpc_port)
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "grpc"}
    pod_labels = grpc["spec"]["template"]["metadata"]["labels"]
    service = of_kind("Service")["funnel-grpc"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["targetPort"], port["appProtocol"]) == ("grpc", "grpc")
    assert of_kind("PodDisruptionBudget")["funnel-grpc"]["spec"]["selector"]["matchLabels"].items() \
        <= pod_labels.items()
    # The pod stops within its grace: the preStop pause, then the drain of a whole request deadline.
    timeout_s = float(env_of(container)["FUNNEL_REQUEST_TIMEOUT_S"]["value"])
    assert grpc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 5 + timeout_s + 5


def test_kustomization_lists_every_manifest():
    (kustomization,) = k8s_documents()["kustomization.yaml"]
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} - EXAMPLES
    assert listed == on_disk
    images = {c["image"].split(":")[0] for _, d in resources() if d["kind"] == "Deployment"
              for c in containers(d)}
    assert images <= {i["name"] for i in kustomization["images"]}


def test_kustomize_build_validates():
    """Where kubectl is installed: render the kustomization and validate what it renders."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: the kustomization is checked by hand only")
    done = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {"funnel"}
    for doc in rendered:
        if doc["kind"] not in KEDA_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
    assert len(rendered) == sum(len(docs) for name, docs in k8s_documents().items()
                                if name not in EXAMPLES | {"kustomization.yaml"})
