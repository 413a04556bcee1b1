"""cluster_configs/kuberay-raycluster.yaml and kuberay-rayjob.yaml: valid for KubeRay, and
what hetero_ray needs from them.

Three kinds of checks, none needing a cluster:

- KubeRay's CRD schemas: each manifest is validated with ``jsonschema`` against the
  ``openAPIV3Schema`` of KubeRay's released CRDs (``ray.io_rayclusters.yaml``,
  ``ray.io_rayjobs.yaml``), read with the Kubernetes extensions as the API server reads
  them (int-or-string, nullable, unknown fields refused as ``kubectl apply`` does by
  default) and against every KubeRay version found. The CRDs are KubeRay's files, kept
  out of this repository: the tests read ``$HETERO_RAY_KUBERAY_CRDS`` when it is set (a
  folder there without CRDs fails the tests), else ``../shared/kuberay`` beside the
  checkout (where CI keeps a copy), one folder per KubeRay version
  (``v1.5.2/ray.io_rayclusters.yaml``, …), and are skipped, saying where they were looked
  for and how to provide them, where there is none (a user's clone). How the schema is
  read is tested on a small schema of our own in any case.
- The rules KubeRay's operator checks in code (its ``validation.go``), which no schema
  expresses: names, ``labels`` outside ``rayStartParams``, SidecarMode's limits, token
  auth's Ray version.
- hetero_ray's needs: the node labels it places by, GPUs only where GPU ranks go, the
  project's images, gloo/NCCL on the pod network, and for the RayJob an entrypoint that
  ``hetero-ray train`` accepts and whose ranks fit the worker groups.

Each check is a function that returns the problems it finds: every test also breaks a
copy of a manifest and asserts that the break is found.
"""

from __future__ import annotations

import copy
import functools
import glob
import math
import os
import re
import shlex

import pytest
import yaml

from hetero_ray.constants import DEVICE_LABEL, GPU_MODEL_LABEL

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO_ROOT, "cluster_configs")
RAYCLUSTER_YAML = os.path.join(CONFIGS, "kuberay-raycluster.yaml")
RAYJOB_YAML = os.path.join(CONFIGS, "kuberay-rayjob.yaml")
MANIFESTS = {"RayCluster": RAYCLUSTER_YAML, "RayJob": RAYJOB_YAML}
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
KUBERAY_CRDS_ENV_VAR = "HETERO_RAY_KUBERAY_CRDS"
DEFAULT_KUBERAY_CRDS = os.path.join(os.path.dirname(REPO_ROOT), "shared", "kuberay")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
GPU = "nvidia.com/gpu"


# --- the manifests


def _documents(path: str) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def _resource(kind: str) -> dict:
    (doc,) = [d for d in _documents(MANIFESTS[kind]) if d["kind"] == kind]
    return doc


def _cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def _groups(spec: dict) -> dict[str, dict]:
    groups = {"head": spec["headGroupSpec"]}
    groups.update({g["groupName"]: g for g in spec.get("workerGroupSpecs", [])})
    return groups


def _containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def _limit(container: dict, name: str) -> str | int | None:
    resources = container.get("resources", {})
    return resources.get("limits", {}).get(name, resources.get("requests", {}).get(name))


def _cpus(quantity) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


_GONE = object()


def _break(doc: dict, path: str, value=_GONE) -> dict:
    """A copy of ``doc`` with the field at ``path`` set to ``value`` (removed if _GONE).

    ``path`` is dotted, a key holding dots in brackets: ``a.0.limits[nvidia.com/gpu]``.
    """
    doc = copy.deepcopy(doc)
    parts = [bracketed or plain for bracketed, plain in re.findall(r"\[([^\]]+)\]|([^.\[\]]+)", path)]
    *parents, last = [int(p) if p.isdigit() else p for p in parts]
    node = doc
    for part in parents:
        node = node[part]
    if value is _GONE:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.fixture(params=sorted(MANIFESTS))
def kind(request) -> str:
    return request.param


# --- KubeRay's CRD schemas, read as the API server reads them


def k8s_json_schema(node):
    """A Kubernetes structural schema (a CRD's openAPIV3Schema) as plain JSON Schema.

    - ``x-kubernetes-int-or-string``: an integer or a string (``cpu: 8``, ``memory: 8Gi``);
    - ``nullable``: null allowed too;
    - an object with ``properties`` and no ``additionalProperties`` refuses other fields,
      unless ``x-kubernetes-preserve-unknown-fields``: the API server would prune them
      silently, and ``kubectl apply`` (strict field validation, its default) refuses them;
    - CEL rules (``x-kubernetes-validations``) and the list/map markers are not checked.
    """
    if isinstance(node, list):
        return [k8s_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: k8s_json_schema(schema) for name, schema in value.items()}
        elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
            out[key] = k8s_json_schema(value)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]  # a pattern, where there is one, applies to the string form
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _format_checker():
    from jsonschema import FormatChecker

    checker = FormatChecker()
    for name, bits in (("int32", 32), ("int64", 64)):
        checker.checks(name)(lambda value, bits=bits: not isinstance(value, int) or
                             -(2 ** (bits - 1)) <= value < 2 ** (bits - 1))
    return checker


def schema_problems(doc: dict, crd: dict) -> list[str]:
    """``path: message`` for each place ``doc`` breaks the CRD's schema of its apiVersion."""
    from jsonschema import Draft7Validator

    group, _, version = doc.get("apiVersion", "").partition("/")
    if group != crd["spec"]["group"] or doc.get("kind") != crd["spec"]["names"]["kind"]:
        return [f"apiVersion/kind {doc.get('apiVersion')}/{doc.get('kind')} is not this CRD's"]
    schemas = {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}
    if version not in schemas:
        return [f"apiVersion {doc['apiVersion']}: this KubeRay serves {sorted(schemas)} only"]
    validator = Draft7Validator(_converted(schemas[version]), format_checker=_format_checker())
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


_CONVERTED: dict[int, tuple[dict, dict]] = {}  # id(schema) -> (schema, its JSON Schema): converted once


def _converted(schema: dict) -> dict:
    hit = _CONVERTED.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = _CONVERTED[id(schema)] = (schema, k8s_json_schema(schema))
    return hit[1]


def kuberay_crds_root(environ=os.environ) -> tuple[str, str]:
    """Where the CRDs are looked for, and how that was chosen: ``$HETERO_RAY_KUBERAY_CRDS``
    when set, else ``shared/kuberay`` beside the checkout (where CI puts its copy)."""
    if environ.get(KUBERAY_CRDS_ENV_VAR):
        return environ[KUBERAY_CRDS_ENV_VAR], f"${KUBERAY_CRDS_ENV_VAR}"
    return DEFAULT_KUBERAY_CRDS, "beside the checkout"


def _kuberay_crd_dirs(root: str) -> list[str]:
    """The version folders (``v1.5.2/``, …) under ``root`` that hold both CRDs."""
    return sorted(d for d in glob.glob(os.path.join(root, "v*"))
                  if all(os.path.isfile(os.path.join(d, name)) for name in CRD_FILES.values()))


def _crd_params() -> list:
    root, how = kuberay_crds_root()
    found = _kuberay_crd_dirs(root)
    if found:
        return found
    # Asked for by name, a wrong path is an error, not a skip.
    return [None] if how == "beside the checkout" else [_MISNAMED]


_MISNAMED = ""  # the parameter when $HETERO_RAY_KUBERAY_CRDS names a folder without CRDs


@functools.lru_cache(maxsize=None)
def _crd(folder: str, kind: str) -> dict:
    with open(os.path.join(folder, CRD_FILES[kind])) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # ~1 MB: libyaml


@pytest.fixture(params=_crd_params(), ids=lambda d: os.path.basename(d) if d else "no-crds")
def crds(request):
    """The CRD of each kind in one KubeRay version's folder."""
    if request.param == _MISNAMED:
        root, how = kuberay_crds_root()
        pytest.fail(f"{how}={root} holds no KubeRay version folder with {' and '.join(CRD_FILES.values())} "
                    "(e.g. v1.5.2/); point it at the folder of version folders, or unset it")
    if request.param is None:
        pytest.skip(f"KubeRay's CRDs are not part of this repository and none were found in {DEFAULT_KUBERAY_CRDS} "
                    f"(one folder per KubeRay version, e.g. v1.5.2/, with {' and '.join(CRD_FILES.values())} "
                    f"from ray-operator/config/crd/bases/ of that tag); put them there or set "
                    f"${KUBERAY_CRDS_ENV_VAR} to their folder to run the schema checks")
    return {kind: _crd(request.param, kind) for kind in CRD_FILES}


def test_the_crds_are_looked_for_beside_the_checkout_unless_named():
    assert kuberay_crds_root({}) == (os.path.join(os.path.dirname(REPO_ROOT), "shared", "kuberay"),
                                     "beside the checkout")
    assert kuberay_crds_root({KUBERAY_CRDS_ENV_VAR: "/opt/crds"}) == ("/opt/crds", f"${KUBERAY_CRDS_ENV_VAR}")


def test_the_schema_reading_follows_the_kubernetes_extensions():
    """On a small CRD of our own, so it runs where KubeRay's CRDs are not at hand."""
    crd = {"spec": {"group": "example.io", "names": {"kind": "Thing"}, "versions": [{"name": "v1", "schema": {
        "openAPIV3Schema": {"type": "object", "required": ["spec"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
            "spec": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"},
                "count": {"type": "integer", "format": "int32"},
                "cpu": {"x-kubernetes-int-or-string": True, "pattern": "^[0-9]+m?$"},
                "note": {"type": "string", "nullable": True},
                "anything": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                             "properties": {"known": {"type": "string"}}},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
            }}}}}}]}, "metadata": {"name": "things.example.io"}}
    good = {"apiVersion": "example.io/v1", "kind": "Thing", "metadata": {"name": "t"},
            "spec": {"name": "t", "count": 3, "cpu": "500m", "note": None,
                     "anything": {"known": "x", "free": [1, {"form": True}]}, "env": {"A": "1"}}}
    assert schema_problems(good, crd) == []
    assert schema_problems(dict(good, spec=dict(good["spec"], cpu=8)), crd) == []  # int-or-string: both

    def broken(**spec) -> list[str]:
        return schema_problems(dict(good, spec={k: v for k, v in {**good["spec"], **spec}.items()
                                                if v is not _GONE}), crd)

    assert broken(cpu="eight") and "does not match" in broken(cpu="eight")[0]
    assert broken(cpu=1.5)  # neither integer nor string
    assert broken(count="3") == ["spec.count: '3' is not of type 'integer'"]
    assert broken(count=2 ** 31) and "int32" in broken(count=2 ** 31)[0]
    assert broken(name=_GONE) == ["spec: 'name' is a required property"]
    assert broken(nmae="t") and "'nmae' was unexpected" in broken(nmae="t")[0]  # a typo is refused
    assert broken(env={"A": 1}) == ["spec.env.A: 1 is not of type 'string'"]
    assert schema_problems(dict(good, apiVersion="example.io/v2"), crd)[0].startswith("apiVersion example.io/v2")



def test_both_manifests_are_valid_for_kuberays_crd_schemas(crds, kind):
    for doc in _documents(MANIFESTS[kind]):
        if doc["kind"] in CRD_FILES:
            assert schema_problems(doc, crds[doc["kind"]]) == [], MANIFESTS[kind]


_GPU_CONTAINER = "rayClusterSpec.workerGroupSpecs.0.template.spec.containers.0"


@pytest.mark.parametrize("path, value, says", [
    ("shutdownAfterJobFinishes", "yes", "spec.shutdownAfterJobFinishes: 'yes' is not of type 'boolean'"),
    ("ttlSecondsAfterFinished", "10m", "spec.ttlSecondsAfterFinished: '10m' is not of type 'integer'"),
    ("rayClusterSpec.workerGroupSpecs.0.replicas", "two", "is not of type 'integer'"),
    ("rayClusterSpec.headGroupSpec.rayStartParams.num-cpus", 0, "num-cpus: 0 is not of type 'string'"),
    ("rayClusterSpec.workerGroupSpecs.0.replica", 2, "'replica' was unexpected"),  # a typo
    (f"{_GPU_CONTAINER}.resource", {}, "'resource' was unexpected"),
    (f"{_GPU_CONTAINER}.resources.limits.memory", "32 GB", "does not match"),
    (f"{_GPU_CONTAINER}.name", _GONE, "'name' is a required property"),
    ("rayClusterSpec.workerGroupSpecs.1.groupName", _GONE, "'groupName' is a required property"),
    ("rayClusterSpec.headGroupSpec", _GONE, "'headGroupSpec' is a required property"),
    ("rayClusterSpec.authOptions.mode", "password", "is not one of ['disabled', 'token']"),
])
def test_a_broken_rayjob_is_refused_by_the_schema(crds, path, value, says):
    problems = schema_problems(_break(_resource("RayJob"), f"spec.{path}", value), crds["RayJob"])
    assert any(says in p for p in problems), problems


def test_a_broken_raycluster_is_refused_by_the_schema(crds):
    cluster = _resource("RayCluster")
    for path, value, says in [
        ("spec.workerGroupSpecs.1.minReplicas", "2", "is not of type 'integer'"),
        ("spec.headGroupSpec.template.spec.volumes.1.secret.defaultMode", "0440", "is not of type 'integer'"),
        ("spec.headGroupSpec.labels", ["hetero-ray.io/device=cpu"], "is not of type 'object'"),
        ("spec.headGroupSpec.template.spec.containers.0.volumeMounts.0.mountPath", _GONE, "'mountPath' is a required"),
    ]:
        problems = schema_problems(_break(cluster, path, value), crds["RayCluster"])
        assert any(says in p for p in problems), (path, problems)


# --- what KubeRay's operator checks in code (ray-operator/controllers/ray/utils/validation.go)

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_NAME = {"RayCluster": 53, "RayJob": 47}  # a RayJob's cluster is named after it, plus a suffix
_RAY_START_RESOURCES = ("num-cpus", "num-gpus", "memory", "resources")
_TOKEN_AUTH_MIN_RAY = (2, 52, 0)


def kuberay_rule_problems(doc: dict) -> list[str]:
    problems = []
    name = doc["metadata"]["name"]
    if len(name) > _MAX_NAME[doc["kind"]] or not _DNS_1035.match(name):
        problems.append(f"name {name!r}: a DNS-1035 label of at most {_MAX_NAME[doc['kind']]} characters")
    spec = _cluster_spec(doc)
    for group_name, group in _groups(spec).items():
        params = group.get("rayStartParams", {})
        if not all(isinstance(v, str) for v in params.values()):
            problems.append(f"{group_name}: rayStartParams values are strings (quote numbers)")
        if "labels" in params:
            problems.append(f"{group_name}: labels go in the group's `labels`, not rayStartParams")
        if group.get("resources") and any(params.get(k) for k in _RAY_START_RESOURCES):
            problems.append(f"{group_name}: resources in both rayStartParams and `resources`")
    if spec.get("authOptions", {}).get("mode") == "token":
        version = tuple(int(p) for p in re.findall(r"\d+", spec.get("rayVersion", ""))[:3])
        if version < _TOKEN_AUTH_MIN_RAY:
            problems.append("authOptions token needs rayVersion >= 2.52.0")
    if doc["kind"] == "RayJob":
        job = doc["spec"]
        if job.get("submissionMode") == "SidecarMode":
            if "submitterPodTemplate" in job or "submitterConfig" in job:
                problems.append("SidecarMode takes no submitterPodTemplate or submitterConfig")
            if spec["headGroupSpec"]["template"]["spec"].get("restartPolicy", "Never") != "Never":
                problems.append("SidecarMode: the head's restartPolicy must be Never or unset")
        if job.get("ttlSecondsAfterFinished", 0) < 0 or job.get("backoffLimit", 0) < 0:
            problems.append("ttlSecondsAfterFinished and backoffLimit must not be negative")
        if job.get("activeDeadlineSeconds", 1) <= 0:
            problems.append("activeDeadlineSeconds must be positive")
    return problems


def test_both_manifests_pass_the_operators_own_checks(kind):
    assert kuberay_rule_problems(_resource(kind)) == []


@pytest.mark.parametrize("path, value, says", [
    ("metadata.name", "hetero-ray-train-on-the-big-cluster-in-the-basement", "DNS-1035"),
    ("metadata.name", "Hetero_Ray", "DNS-1035"),
    ("spec.rayClusterSpec.workerGroupSpecs.0.rayStartParams.labels", "hetero-ray.io/device=gpu", "not rayStartParams"),
    ("spec.rayClusterSpec.workerGroupSpecs.1.resources", {"CPU": "8"}, "both rayStartParams"),
    ("spec.rayClusterSpec.workerGroupSpecs.1.rayStartParams.num-gpus", 0, "quote numbers"),
    ("spec.rayClusterSpec.rayVersion", "2.51.0", "2.52.0"),
    ("spec.submitterConfig", {"backoffLimit": 2}, "SidecarMode takes no"),
    ("spec.rayClusterSpec.headGroupSpec.template.spec.restartPolicy", "Always", "restartPolicy"),
    ("spec.activeDeadlineSeconds", 0, "activeDeadlineSeconds"),
])
def test_what_the_operator_refuses_is_found(path, value, says):
    problems = kuberay_rule_problems(_break(_resource("RayJob"), path, value))
    assert any(says in p for p in problems), problems


# --- what hetero_ray needs of every cluster: labels, GPUs, images, the network


def placement_problems(spec: dict) -> list[str]:
    """The node labels hetero_ray places by, and GPUs where (only where) GPU ranks go."""
    from ray._private.label_utils import validate_node_label_syntax

    problems = []
    for name, group in _groups(spec).items():
        labels = group.get("labels", {})
        try:
            validate_node_label_syntax(labels)  # what Ray accepts as node labels
        except ValueError as e:
            problems.append(f"{name}: {e}")
        if {k for k in labels if k.startswith("hetero-ray.io/")} - {DEVICE_LABEL, GPU_MODEL_LABEL}:
            problems.append(f"{name}: a hetero-ray.io/ label the code does not read")
        device = labels.get(DEVICE_LABEL)
        gpus = [_limit(c, GPU) for c in _containers(group)]
        if device == "gpu":
            if not labels.get(GPU_MODEL_LABEL):
                problems.append(f"{name}: a GPU group names its model ({GPU_MODEL_LABEL})")
            if not all(g and int(g) >= 1 for g in gpus):
                problems.append(f"{name}: labelled gpu but its containers request no {GPU}")
            tolerated = [t for t in group["template"]["spec"].get("tolerations", [])
                         if t.get("key") == GPU and t.get("operator") == "Exists"
                         and t.get("effect") in (None, "NoSchedule")]
            if not tolerated:
                problems.append(f"{name}: a GPU group tolerates the {GPU} taint of GPU nodes (operator Exists, "
                                "effect NoSchedule)")
        elif device == "cpu":
            if any(gpus):
                problems.append(f"{name}: labelled cpu but requests {GPU}")
            if name != "head" and group.get("rayStartParams", {}).get("num-gpus") != "0":
                problems.append(f"{name}: a CPU group offers no GPU to Ray (rayStartParams num-gpus: \"0\")")
        else:
            problems.append(f"{name}: {DEVICE_LABEL} must be gpu or cpu, got {device!r}")
    devices = {g.get("labels", {}).get(DEVICE_LABEL) for n, g in _groups(spec).items() if n != "head"}
    if devices != {"gpu", "cpu"}:
        problems.append(f"the worker groups must mix gpu and cpu, got {sorted(map(str, devices))}")
    if spec["headGroupSpec"].get("rayStartParams", {}).get("num-cpus") != "0":
        problems.append("the head trains nothing: rayStartParams num-cpus \"0\"")
    return problems


def _dockerfile_images() -> dict[str, str]:
    """tag → base image, from the `docker build` lines the Dockerfile documents."""
    with open(os.path.join(REPO_ROOT, "Dockerfile")) as f:
        text = re.sub(r"\\\n#?\s*", " ", f.read())
    default_base = re.search(r"^ARG RAY_IMAGE=(\S+)", text, re.M).group(1)
    images = {}
    for line in re.findall(r"docker build .*", text):
        base = re.search(r"--build-arg RAY_IMAGE=(\S+)", line)
        images[re.search(r"-t (\S+)", line).group(1)] = base.group(1) if base else default_base
    return images


def image_problems(spec: dict) -> list[str]:
    """Every Ray container runs an image the Dockerfile builds, with CUDA where GPU ranks go."""
    built = _dockerfile_images()
    problems = []
    for name, group in _groups(spec).items():
        for container in _containers(group):
            base = built.get(container.get("image"))
            if base is None:
                problems.append(f"{name}: image {container.get('image')!r} is none of the Dockerfile's {sorted(built)}")
            elif base.endswith("-gpu") != (group.get("labels", {}).get(DEVICE_LABEL) == "gpu"):
                problems.append(f"{name}: image {container['image']} is built on {base}")
    return problems


def network_problems(spec: dict) -> list[str]:
    problems = []
    for name, group in _groups(spec).items():
        for container in _containers(group):
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            if (env.get("GLOO_SOCKET_IFNAME"), env.get("NCCL_SOCKET_IFNAME")) != ("eth0", "=eth0"):
                problems.append(f"{name}: gloo and NCCL must use the pod network (GLOO_SOCKET_IFNAME=eth0, "
                                "NCCL_SOCKET_IFNAME==eth0)")
            if env.get("RAY_AUTH_MODE", "token") != "token" or "RAY_AUTH_TOKEN" in env:
                problems.append(f"{name}: token auth off, or a token written into the manifest")
    if spec["headGroupSpec"].get("serviceType", "ClusterIP") != "ClusterIP":
        problems.append("the head's Service must stay ClusterIP: the job API runs arbitrary code")
    return problems


CLUSTER_CHECKS = [placement_problems, image_problems, network_problems]


@pytest.mark.parametrize("check", CLUSTER_CHECKS, ids=lambda f: f.__name__)
def test_both_clusters_meet_hetero_rays_needs(kind, check):
    assert check(_cluster_spec(_resource(kind))) == []


@pytest.mark.parametrize("check, path, value, says", [
    (placement_problems, "workerGroupSpecs.1.labels", {DEVICE_LABEL: "gpu"}, "names its model"),
    (placement_problems, "workerGroupSpecs.0.labels", {DEVICE_LABEL: "GPU!"}, "hetero-ray.io/device"),
    (placement_problems, "workerGroupSpecs.0.labels[hetero-ray.io/speed]", "fast", "does not read"),
    (placement_problems, f"workerGroupSpecs.0.template.spec.containers.0.resources.limits[{GPU}]", 0, "request no"),
    (placement_problems, "workerGroupSpecs.1.rayStartParams.num-gpus", _GONE, "offers no GPU"),
    (placement_problems, "headGroupSpec.rayStartParams.num-cpus", _GONE, "the head trains nothing"),
    (placement_problems, "workerGroupSpecs.0.template.spec.tolerations", _GONE, "tolerates the nvidia.com/gpu taint"),
    (placement_problems, "workerGroupSpecs.0.template.spec.tolerations.0.effect", "NoExecute", "tolerates"),
    (image_problems, "workerGroupSpecs.1.template.spec.containers.0.image", "rayproject/ray:2.60.0", "none of"),
    (image_problems, "workerGroupSpecs.0.template.spec.containers.0.image", "ghcr.io/your-org/hetero-ray:0.1.0-cpu",
     "is built on rayproject/ray:"),
    (network_problems, "workerGroupSpecs.1.template.spec.containers.0.env", [], "pod network"),
    (network_problems, "headGroupSpec.serviceType", "LoadBalancer", "ClusterIP"),
])
def test_what_hetero_ray_needs_is_checked(kind, check, path, value, says):
    doc = _resource(kind)
    prefix = "spec.rayClusterSpec." if kind == "RayJob" else "spec."
    problems = check(_cluster_spec(_break(doc, prefix + path, value)))
    assert any(says in p for p in problems), problems


def test_the_two_manifests_describe_the_same_cluster_kind():
    """The RayJob's cluster is the RayCluster's groups, images and labels (its own auth and
    storage apart): a change to one that the other misses is found here."""
    import ray

    cluster, job = _cluster_spec(_resource("RayCluster")), _cluster_spec(_resource("RayJob"))
    assert cluster["rayVersion"] == job["rayVersion"] == ray.__version__

    def shape(spec):
        return {name: (group.get("labels"), [c["image"] for c in _containers(group)],
                       group["template"]["spec"].get("nodeSelector"))
                for name, group in _groups(spec).items()}

    assert shape(cluster) == shape(job)


# --- the RayCluster's own: a long-lived cluster, the token from a Secret as a file


def test_raycluster_every_ray_container_reads_the_token_from_the_secret_mounted_as_a_file():
    """The token reaches Ray as a read-only file (RAY_AUTH_TOKEN_PATH, which Ray 2.60 reads),
    never as an environment variable every process in the container would inherit."""
    cluster = _resource("RayCluster")
    secrets = set()
    for name, group in _groups(cluster["spec"]).items():
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in _containers(group):
            env = {e["name"]: e for e in container.get("env", [])}
            assert env["RAY_AUTH_MODE"]["value"] == "token", name
            assert "RAY_AUTH_TOKEN" not in env, name  # no token in any container's environment
            token_path = env["RAY_AUTH_TOKEN_PATH"]["value"]
            (mount,) = [m for m in container.get("volumeMounts", [])
                        if token_path.startswith(m["mountPath"].rstrip("/") + "/")]
            assert mount.get("readOnly") is True, name
            secret = volumes[mount["name"]]["secret"]
            (item,) = [i for i in secret["items"] if i["path"] == token_path[len(mount["mountPath"].rstrip("/")) + 1:]]
            assert secret["defaultMode"] & 0o007 == 0, name  # not readable by other users
            secrets.add((secret["secretName"], item["key"]))
    assert len(secrets) == 1  # one cluster, one token
    assert not [d for d in _documents(RAYCLUSTER_YAML) if d["kind"] == "Secret"]  # created with kubectl


PROMETHEUS_PODS = {"app.kubernetes.io/name": "prometheus"}  # the Prometheus operator's pods


def _is_prometheus_rule(rule: dict, port: int) -> bool:
    """An ingress rule that admits Prometheus (any namespace) to the metrics port alone."""
    sources = rule.get("from", [])
    return (len(sources) == 1 and sources[0].get("podSelector", {}).get("matchLabels") == PROMETHEUS_PODS
            and rule.get("ports") == [{"port": port, "protocol": "TCP"}])


def metrics_problems(documents: list[dict]) -> list[str]:
    """Prometheus can scrape every node: each Ray container names its metrics-export-port
    `metrics` (a PodMonitor selects it by name), and the NetworkPolicy admits Prometheus there."""
    (cluster,) = [d for d in documents if d["kind"] in CRD_FILES]
    problems, ports = [], set()
    for name, group in _groups(_cluster_spec(cluster)).items():
        port = group.get("rayStartParams", {}).get("metrics-export-port")
        if port is None:
            problems.append(f"{name}: no metrics-export-port")
            continue
        ports.add(int(port))
        for container in _containers(group):
            named = {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}
            if named.get("metrics") != int(port):
                problems.append(f"{name}: the container names no port `metrics` at {port} (what a PodMonitor scrapes)")
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    for port in ports:
        if not any(_is_prometheus_rule(rule, port) for rule in policy["spec"].get("ingress", [])):
            problems.append(f"the NetworkPolicy keeps Prometheus from the metrics port {port}")
    return problems


@pytest.mark.parametrize("path", [RAYCLUSTER_YAML, RAYJOB_YAML], ids=["RayCluster", "RayJob"])
def test_prometheus_may_scrape_the_metrics_port_of_every_node(path):
    documents = _documents(path)
    assert metrics_problems(documents) == []
    (cluster_index,) = [i for i, d in enumerate(documents) if d["kind"] in CRD_FILES]
    (policy_index,) = [i for i, d in enumerate(documents) if d["kind"] == "NetworkPolicy"]
    prefix = "spec.rayClusterSpec." if documents[cluster_index]["kind"] == "RayJob" else "spec."

    def broken(index, where, value=_GONE) -> list[str]:
        changed = list(documents)
        changed[index] = _break(documents[index], where, value)
        return metrics_problems(changed)

    assert "names no port `metrics`" in broken(cluster_index, prefix + "workerGroupSpecs.1.template.spec.containers.0.ports")[0]
    last = len(documents[policy_index]["spec"]["ingress"]) - 1
    assert "keeps Prometheus" in broken(policy_index, f"spec.ingress.{last}")[0]
    assert "keeps Prometheus" in broken(policy_index, f"spec.ingress.{last}.ports.0.port", 9090)[0]


def test_the_raycluster_keeps_its_runs_on_a_volume_every_pod_mounts():
    """As the RayJob: the header's commands pass --storage-path /shared/runs."""
    spec = _resource("RayCluster")["spec"]
    assert "--storage-path /shared/runs" in open(RAYCLUSTER_YAML).read()
    assert shared_storage_problems(spec, "/shared/runs") == []
    mounts = "workerGroupSpecs.1.template.spec.containers.0.volumeMounts"
    assert "cpu-workers: --storage-path" in shared_storage_problems(_break(spec, mounts, []), "/shared/runs")[0]
    assert shared_storage_problems(spec, "/elsewhere/runs")


def test_raycluster_dashboard_and_ports_are_not_exposed():
    documents = _documents(RAYCLUSTER_YAML)
    cluster = _resource("RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] in LOOPBACK
    assert not [d for d in documents if d["kind"] in ("Service", "Ingress")]
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    own_pods = {"ray.io/cluster": cluster["metadata"]["name"]}
    assert policy["spec"]["podSelector"]["matchLabels"] == own_pods
    own, *others = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": own_pods}}]}  # every port, the cluster's pods only
    metrics_port = int(head["rayStartParams"]["metrics-export-port"])
    assert [_is_prometheus_rule(rule, metrics_port) for rule in others] == [True]  # and Prometheus, one port


# --- the RayJob's own: one run of jobs/train.py on a cluster that goes when it ends


def _dockerfile_workdir() -> str:
    with open(os.path.join(REPO_ROOT, "Dockerfile")) as f:
        text = f.read()
    assert re.search(r"^COPY .*\sjobs/ jobs/$", text, re.M), "the image must hold jobs/"
    return re.search(r"^WORKDIR (\S+)", text, re.M).group(1)


def _train_config(entrypoint: str):
    """The TrainConfig ``hetero-ray train`` builds from the entrypoint's flags (ConfigError,
    or argparse's exit 2, on flags it refuses)."""
    from hetero_ray.cli.main import build_parser
    from hetero_ray.cli.train import config_from_args

    python, script, *flags = shlex.split(entrypoint)
    assert python in ("python", "python3"), entrypoint
    return script, config_from_args(build_parser().parse_args(["train", *flags]))


def entrypoint_problems(job: dict) -> list[str]:
    """The entrypoint runs the image's jobs/train.py with ranks that fit the worker groups."""
    problems = []
    script, config = _train_config(job["spec"]["entrypoint"])
    if script != f"{_dockerfile_workdir()}/jobs/train.py" or not os.path.exists(os.path.join(REPO_ROOT, "jobs/train.py")):
        problems.append(f"the entrypoint runs {script}, not jobs/train.py in the image's {_dockerfile_workdir()}")
    if set(config.worker_devices or ()) != {"gpu", "cpu"}:
        problems.append("the entrypoint must place ranks by --worker-devices on both gpu and cpu nodes")
        return problems
    slots = {"gpu": 0, "cpu": 0}  # ranks each kind of node can hold
    for name, group in _groups(_cluster_spec(job)).items():
        if name == "head":
            continue
        device = group["labels"][DEVICE_LABEL]
        for container in _containers(group):
            per_pod = math.floor(_cpus(_limit(container, "cpu")) / config.cpus_per_worker)
            if device == "gpu":
                per_pod = min(per_pod, int(_limit(container, GPU)))  # one GPU rank per GPU
                if int(_limit(container, GPU)) > per_pod:
                    problems.append(f"{name}: {_limit(container, GPU)} GPUs per pod but CPUs for {per_pod} ranks "
                                    f"of --cpus-per-worker {config.cpus_per_worker:g}")
            slots[device] += per_pod * group.get("replicas", 0)
    for device in ("gpu", "cpu"):
        ranks = config.worker_devices.count(device)
        if (device == "gpu" and ranks != slots["gpu"]) or ranks > slots[device]:
            problems.append(f"--worker-devices asks for {ranks} {device} ranks; the {device} groups hold {slots[device]}")
    return problems


def storage_problems(job: dict) -> list[str]:
    """The run directory outlives the cluster: on one volume claim mounted at the same path
    in every Ray container (the driver on the head, the checkpoints on the workers)."""
    _, config = _train_config(job["spec"]["entrypoint"])
    return shared_storage_problems(_cluster_spec(job), config.storage_path)


def shared_storage_problems(spec: dict, output_dir: str) -> list[str]:
    """``output_dir`` lies on one volume claim mounted there in every Ray container of ``spec``."""
    output_dir = output_dir.rstrip("/")
    problems, claims = [], set()
    for name, group in _groups(spec).items():
        volumes = {v["name"]: v for v in group["template"]["spec"].get("volumes", [])}
        for container in _containers(group):
            mounts = [m for m in container.get("volumeMounts", [])
                      if (output_dir + "/").startswith(m["mountPath"].rstrip("/") + "/")]
            claim = [volumes.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") for m in mounts]
            if len(claim) != 1 or claim[0] is None:
                problems.append(f"{name}: --storage-path {output_dir} is not on a volume claim mounted there")
            claims.update(claim)
    if len(claims - {None}) > 1:
        problems.append(f"--storage-path is on different claims in different pods: {sorted(claims - {None})}")
    return problems


def lifecycle_problems(job: dict) -> list[str]:
    spec, problems = job["spec"], []
    if spec.get("shutdownAfterJobFinishes") is not True:
        problems.append("shutdownAfterJobFinishes: true, or the cluster (and its GPUs) stays after the job")
    if not isinstance(spec.get("ttlSecondsAfterFinished"), int) or spec["ttlSecondsAfterFinished"] <= 0:
        problems.append("ttlSecondsAfterFinished: the seconds to read the logs before the cluster goes")
    if spec.get("clusterSelector"):
        problems.append("the job brings its own cluster (rayClusterSpec), not a clusterSelector")
    return problems


def access_problems(documents: list[dict]) -> list[str]:
    """KubeRay's token auth; the dashboard reached by the job's pods and the operator only."""
    (job,) = [d for d in documents if d["kind"] == "RayJob"]
    spec, problems = _cluster_spec(job), []
    if spec.get("authOptions", {}).get("mode") != "token":
        problems.append("authOptions mode token: the operator polls the job through the dashboard with its token")
    if [d for d in documents if d["kind"] in ("Service", "Ingress", "Secret")]:
        problems.append("no Service, Ingress or Secret: KubeRay makes the head's ClusterIP Service and the token")
    pod_labels = [group["template"].get("metadata", {}).get("labels", {}) for group in _groups(spec).values()]
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    if len(policies) != 1:
        return [*problems, "one NetworkPolicy for the job's pods"]
    policy = policies[0]["spec"]
    selector = policy["podSelector"].get("matchLabels", {})
    if not selector or not all(selector.items() <= labels.items() for labels in pod_labels):
        problems.append(f"the NetworkPolicy selects {selector}, which not every group's pods carry")
    for rule in policy.get("ingress", []):
        sources = rule.get("from", [])
        own = sources == [{"podSelector": {"matchLabels": selector}}] and "ports" not in rule
        operator = (len(sources) == 1 and sources[0].get("podSelector", {}).get("matchLabels")
                    == {"app.kubernetes.io/name": "kuberay-operator"}
                    and rule.get("ports") == [{"port": 8265, "protocol": "TCP"}])
        metrics_port = int(spec["headGroupSpec"].get("rayStartParams", {}).get("metrics-export-port", 0))
        if not (own or operator or _is_prometheus_rule(rule, metrics_port)):
            problems.append(f"an ingress rule admits more than the job's pods and the operator's job API: {rule}")
    return problems


def test_the_rayjob_runs_jobs_train_py_with_ranks_that_fit_its_groups():
    job = _resource("RayJob")
    assert entrypoint_problems(job) == []
    _, config = _train_config(job["spec"]["entrypoint"])
    assert set(config.worker_devices) == {"gpu", "cpu"}  # mixed, as the issue asks


def _with_flags(job: dict, **flags: str) -> dict:
    """The job with the entrypoint's --flag values replaced (``cpus_per_worker="5"``)."""
    words = shlex.split(job["spec"]["entrypoint"])
    for name, value in flags.items():
        words[words.index("--" + name.replace("_", "-")) + 1] = value
    return _break(job, "spec.entrypoint", shlex.join(words))


@pytest.mark.parametrize("flags, says", [
    ({"worker_devices": "gpu,gpu,gpu,cpu,cpu,cpu"}, "3 gpu ranks; the gpu groups hold 2"),
    ({"worker_devices": "gpu,cpu,cpu,cpu,cpu,cpu"}, "1 gpu ranks; the gpu groups hold 2"),  # a GPU left idle
    ({"cpus_per_worker": "5"}, "4 cpu ranks; the cpu groups hold 2"),
    ({"cpus_per_worker": "9"}, "1 GPUs per pod but CPUs for 0 ranks"),
    ({"num_workers": "2", "worker_devices": "gpu,gpu"}, "both gpu and cpu"),
])
def test_an_entrypoint_the_groups_cannot_hold_is_found(flags, says):
    problems = entrypoint_problems(_with_flags(_resource("RayJob"), **flags))
    assert any(says in p for p in problems), problems


def test_an_entrypoint_hetero_ray_refuses_fails():
    from hetero_ray.errors import ConfigError

    job = _resource("RayJob")
    with pytest.raises(ConfigError, match="--worker-devices"):  # 6 workers, 5 devices
        entrypoint_problems(_with_flags(job, worker_devices="gpu,cpu,cpu,cpu,cpu"))
    with pytest.raises(SystemExit):  # a flag `hetero-ray train` does not have
        entrypoint_problems(_break(job, "spec.entrypoint", job["spec"]["entrypoint"] + " --gpus-per-worker 1"))
    moved = _break(job, "spec.entrypoint", job["spec"]["entrypoint"].replace("/jobs/train.py", "/train.py"))
    assert "not jobs/train.py" in entrypoint_problems(moved)[0]


def test_the_rayjob_keeps_its_runs_on_a_volume_every_pod_mounts():
    job = _resource("RayJob")
    assert storage_problems(job) == []
    head = "spec.rayClusterSpec.headGroupSpec.template.spec"
    assert "head: --storage-path" in storage_problems(_break(job, f"{head}.containers.0.volumeMounts", []))[0]
    assert "not on a volume claim" in storage_problems(_break(job, f"{head}.volumes.0", {"name": "runs", "emptyDir": {}}))[0]
    elsewhere = _break(job, "spec.entrypoint", job["spec"]["entrypoint"].replace("/shared/runs", "runs"))
    assert len(storage_problems(elsewhere)) == 3


def test_the_rayjob_cluster_goes_when_the_job_ends():
    job = _resource("RayJob")
    assert lifecycle_problems(job) == []
    assert "shutdownAfterJobFinishes" in lifecycle_problems(_break(job, "spec.shutdownAfterJobFinishes", False))[0]
    assert "ttlSecondsAfterFinished" in lifecycle_problems(_break(job, "spec.ttlSecondsAfterFinished"))[0]


def test_the_rayjob_uses_kuberays_token_and_admits_only_its_pods_and_the_operator():
    documents = _documents(RAYJOB_YAML)
    assert access_problems(documents) == []
    (job_index,) = [i for i, d in enumerate(documents) if d["kind"] == "RayJob"]
    (policy_index,) = [i for i, d in enumerate(documents) if d["kind"] == "NetworkPolicy"]

    def broken(index, path, value=_GONE) -> list[str]:
        changed = list(documents)
        changed[index] = _break(documents[index], path, value)
        return access_problems(changed)

    assert "authOptions" in broken(job_index, "spec.rayClusterSpec.authOptions")[0]
    assert "not every group" in broken(job_index, "spec.rayClusterSpec.workerGroupSpecs.1.template.metadata")[0]
    assert "admits more" in broken(policy_index, "spec.ingress.1.ports")[0]  # the operator to every port
    assert "admits more" in broken(policy_index, "spec.ingress.0.from", [{"namespaceSelector": {}}])[0]
    assert "no Service" in access_problems([*documents, {"kind": "Service"}])[0]
