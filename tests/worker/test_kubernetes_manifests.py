"""deploy/kubernetes: every manifest against the Kubernetes schemas (offline: the schemas
ship inside the kubernetes-validate wheel), and what no schema checks: that the files
name one another correctly, that the worker's settings in them parse, that the shutdown
fits in the grace period, and that the autoscaler's metric is one a running worker serves.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from packaging.version import Version

from kernel_pool.config import PoolConfig
from kernel_worker.cli import settings_from
from kernel_worker.http.server import CLOSE_SECONDS
from tests.conftest import free_port, start_worker

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
DOCKERFILE = KUBE.parent / "Dockerfile"
METRIC = "strata_kernel_worker_active_executions"
#: the oldest Kubernetes the manifests are written for (PDB unhealthyPodEvictionPolicy: 1.27)
OLDEST = Version("1.27")
#: files that are not Kubernetes objects, each said why
NOT_OBJECTS = {
    "monitoring/prometheus-adapter-values.yaml": "Helm values of the Prometheus Adapter",
}
SCHEMALESS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("keda.sh/v1alpha1", "ScaledObject")}
KUSTOMIZE_KINDS = {"Kustomization", "Component"}


def _quantity(text: str) -> int:
    """A Kubernetes memory quantity in binary units (what these manifests use) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(text))
    assert match is not None, f"not a binary quantity: {text!r}"
    power = "_KMGT".index(match.group(2)[0]) if match.group(2) else 0
    return int(match.group(1)) * 1024**power


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _rel(path: Path) -> str:
    return path.relative_to(KUBE).as_posix()


def _kustomizations() -> dict[Path, dict[str, Any]]:
    """Each kustomization.yaml (the base and its components) by folder."""
    return {p.parent: _load(p)[0] for p in sorted(KUBE.rglob("kustomization.yaml"))}


def _listed(key: str) -> list[Path]:
    found = []
    for folder, kustomization in _kustomizations().items():
        for entry in kustomization.get(key, []):
            found.append(folder / (entry["path"] if isinstance(entry, dict) else entry))
    return found


@cache
def _base() -> dict[tuple[str, str], dict[str, Any]]:
    """The base's objects (kustomization.yaml's resources) by (kind, name)."""
    objects = {}
    for path in _listed_in(KUBE, "resources"):
        for doc in _load(path):
            objects[doc["kind"], doc["metadata"]["name"]] = doc
    return objects


def _listed_in(folder: Path, key: str) -> list[Path]:
    kustomization = _kustomizations()[folder]
    return [folder / e["path"] if isinstance(e, dict) else folder / e for e in kustomization[key]]


def _merge(base: Any, patch: Any) -> Any:
    """A strategic-merge patch as kustomize applies these: maps merge, lists of named maps
    (containers, env, ports, volumes) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(i, dict) and "name" in i for i in [*base, *patch]):
        merged_list = [copy.deepcopy(i) for i in base]
        index = {item["name"]: n for n, item in enumerate(merged_list)}
        for item in patch:
            if item["name"] in index:
                merged_list[index[item["name"]]] = _merge(merged_list[index[item["name"]]], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def _variants() -> Iterator[tuple[str, dict[tuple[str, str], dict[str, Any]]]]:
    """The base, and the base with each component applied (its resources added, its
    patches merged or, for ``$patch: delete``, the object removed)."""
    yield "base", _base()
    for folder, kustomization in _kustomizations().items():
        if kustomization["kind"] != "Component":
            continue
        objects = copy.deepcopy(_base())
        for path in _listed_in(folder, "resources") if "resources" in kustomization else []:
            for doc in _load(path):
                objects[doc["kind"], doc["metadata"]["name"]] = doc
        for path in _listed_in(folder, "patches") if "patches" in kustomization else []:
            (patch,) = _load(path)
            key = (patch["kind"], patch["metadata"]["name"])
            assert key in objects, f"{_rel(path)} patches {key}, which the base does not have"
            if patch.get("$patch") == "delete":
                del objects[key]
            else:
                objects[key] = _merge(objects[key], patch)
        yield _rel(folder), objects


def _versions() -> list[str]:
    available = sorted({Version(v) for v in all_versions()})
    oldest = min((v for v in available if v >= OLDEST), default=available[0])
    return sorted({str(oldest), str(available[-1])}, key=Version)


# -- every file is accounted for ------------------------------------------------------------


def test_every_file_is_a_resource_a_patch_or_said_why() -> None:
    files = {_rel(p) for p in KUBE.rglob("*.yaml")}
    accounted = {_rel(p) for p in KUBE.rglob("kustomization.yaml")}
    accounted |= {_rel(p) for p in _listed("resources") + _listed("patches")}
    accounted |= set(NOT_OBJECTS)
    assert files == accounted, f"not in any kustomization: {sorted(files - accounted)}"
    for path in _listed("resources") + _listed("patches"):
        assert path.is_file(), f"listed but missing: {path}"
    for folder, kustomization in _kustomizations().items():
        assert kustomization["apiVersion"].startswith("kustomize.config.k8s.io/")
        assert kustomization["kind"] in KUSTOMIZE_KINDS, folder
        assert kustomization["kind"] == ("Kustomization" if folder == KUBE else "Component")


def test_every_object_has_identity() -> None:
    for path in _listed("resources") + _listed("patches"):
        for doc in _load(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), _rel(path)
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


# -- schemas ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", _versions())
def test_objects_match_the_kubernetes_schemas(version: str) -> None:
    """Strict: an unknown or misspelt field fails as well as a missing or mistyped one;
    the base and every component's result (patches applied) are checked."""
    checked = 0
    for variant, objects in _variants():
        for (kind, name), doc in objects.items():
            if (doc["apiVersion"], kind) in SCHEMALESS:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{variant}: {kind}/{name} ({version}): {exc.message} at {list(exc.path)}"
                )
            checked += 1
    assert checked >= 5  # Deployment, 2 Services, PDB, HPA at least


def test_schemaless_objects_have_their_shape() -> None:
    """What the CRDs of the Prometheus Operator and KEDA would check first."""
    objects = {key: doc for _, variant in _variants() for key, doc in variant.items()}
    monitor = objects["ServiceMonitor", "strata-kernel-worker"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"] and monitor["spec"]["endpoints"]
    scaled = objects["ScaledObject", "strata-kernel-worker"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
    float(trigger["metadata"]["threshold"])  # KEDA wants a number in a string


# -- cross references -----------------------------------------------------------------------


def _pod(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = objects["Deployment", "strata-kernel-worker"]["spec"]["template"]
    return pod


def _container(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = _pod(objects)["spec"]["containers"]
    return dict(container)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("variant", [name for name, _ in _variants()])
def test_names_and_selectors_agree(variant: str) -> None:
    objects = dict(_variants())[variant]
    deployment = objects["Deployment", "strata-kernel-worker"]
    labels = _pod(objects)["metadata"]["labels"]
    assert _matches(deployment["spec"]["selector"]["matchLabels"], labels)
    container = _container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    services = {name: doc for (kind, name), doc in objects.items() if kind == "Service"}
    assert services
    for name, service in services.items():
        assert _matches(service["spec"]["selector"], labels), name
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{name}: no container port {port['targetPort']}"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports, probe
    (pdb,) = [doc for (kind, _), doc in objects.items() if kind == "PodDisruptionBudget"]
    assert _matches(pdb["spec"]["selector"]["matchLabels"], labels)
    scalers = [
        doc
        for (kind, _), doc in objects.items()
        if kind in ("HorizontalPodAutoscaler", "ScaledObject")
    ]
    assert len(scalers) == 1, "one autoscaler per Deployment, never two"
    target = scalers[0]["spec"]["scaleTargetRef"]
    assert (target.get("kind", "Deployment"), target["name"]) == (
        "Deployment",
        deployment["metadata"]["name"],
    )
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    monitor = objects.get(("ServiceMonitor", "strata-kernel-worker"))
    if monitor is not None:  # it finds a Service with the port it scrapes
        selected = [
            s
            for s in services.values()
            if _matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert len(selected) == 1
        names = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert all(e["port"] in names for e in monitor["spec"]["endpoints"])


def test_the_token_comes_from_the_generated_secret_and_stays_out_of_git() -> None:
    token = _env(_base())["STRATA_WORKER_TOKEN"]
    ref = token["valueFrom"]["secretKeyRef"]
    (generator,) = _kustomizations()[KUBE]["secretGenerator"]
    assert generator["name"] == ref["name"]
    (env_file,) = generator["envs"]
    assert ref["key"] == "token"  # the env file's one line: token=...
    ignored = (KUBE / ".gitignore").read_text().splitlines()
    assert env_file in ignored, "the token file must never be committed"


# -- the worker's settings --------------------------------------------------------------------


def _env(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e for e in _container(objects)["env"]}


def _settings(objects: dict[tuple[str, str], dict[str, Any]]) -> Any:
    """The worker's settings as the pod's args and environment give them (argparse exits on
    an unknown flag or a bad value)."""
    env = {name: e["value"] for name, e in _env(objects).items() if "value" in e}
    return settings_from(_container(objects)["args"], env)


def _seconds_of(probe: dict[str, Any]) -> int:
    return int(probe["periodSeconds"]) * int(probe["failureThreshold"])


@pytest.mark.parametrize("variant", [name for name, _ in _variants()])
def test_settings_parse_and_match_the_ports(variant: str) -> None:
    objects = dict(_variants())[variant]
    settings = _settings(objects)
    ports = {p["name"]: p["containerPort"] for p in _container(objects)["ports"]}
    assert settings.port == ports["http"] and settings.metrics_port == ports["metrics"]
    assert settings.host == "0.0.0.0"
    annotations = _pod(objects)["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    # the image's CMD (replaced by args) names the same metrics port
    cmd = next(line for line in DOCKERFILE.read_text().splitlines() if line.startswith("CMD"))
    image_args = yaml.safe_load(cmd.removeprefix("CMD "))
    assert settings_from(image_args, {}).metrics_port == ports["metrics"]


@pytest.mark.parametrize("variant", [name for name, _ in _variants()])
def test_shutdown_fits_in_the_grace_period(variant: str) -> None:
    """preStop, then SIGTERM: the drain, the answers still being sent, the pool's bounded
    shutdown (leases, resets, kernel stops) must all end before SIGKILL."""
    objects = dict(_variants())[variant]
    pod = _pod(objects)["spec"]
    pre_stop = _container(objects)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep = float(pre_stop[1])
    drain = _settings(objects).drain_seconds
    pool_shutdown = 3 * PoolConfig().shutdown_timeout_seconds + 1
    assert pod["terminationGracePeriodSeconds"] > sleep + drain + CLOSE_SECONDS + pool_shutdown
    # the arithmetic in the manifest's comment is the one checked here
    text = (KUBE / "deployment.yaml").read_text()
    assert f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']}" in text
    assert f'"sleep", "{int(sleep)}"' in text


@pytest.mark.parametrize("variant", [name for name, _ in _variants()])
def test_probes_and_resources_fit_the_worker(variant: str) -> None:
    objects = dict(_variants())[variant]
    container = _container(objects)
    settings = _settings(objects)
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    # liveness waits out a start whose kernels (and preload) may take --kernel-start-timeout
    assert _seconds_of(container["startupProbe"]) >= settings.kernel_start_timeout
    pod = _pod(objects)["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and not pod["automountServiceAccountToken"]
    # the memory limit holds every kernel at its cap, the run directories' tmpfs and the worker
    kernels = settings.pool_size + settings.spares
    assert settings.max_kernel_memory is not None
    shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    tmpfs = sum(_quantity(v["emptyDir"]["sizeLimit"]) for v in shm)
    limit = _quantity(container["resources"]["limits"]["memory"])
    assert limit >= kernels * settings.max_kernel_memory + tmpfs + _quantity("512Mi")
    assert _quantity(container["resources"]["requests"]["memory"]) <= limit
    # the run directories go to /dev/shm only with 2 GiB free there
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert all(mounts[v["name"]] == "/dev/shm" and tmpfs >= _quantity("2Gi") for v in shm)
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    if gpus is not None:  # one slot per GPU the device plugin gives the container
        assert len(settings.gpu_slots) == int(gpus) and settings.pool_size == int(gpus)
        assert settings.spares == 0


# -- the autoscaler's metric ------------------------------------------------------------------


def _target(objects: dict[tuple[str, str], dict[str, Any]]) -> tuple[str | None, float]:
    """The metric an autoscaler targets (None where a query names it) and its per-pod value."""
    for (kind, _), doc in objects.items():
        if kind == "HorizontalPodAutoscaler":
            (metric,) = doc["spec"]["metrics"]
            pods = metric["pods"]
            value = pods["target"]["averageValue"]
            number = int(value[:-1]) / 1000 if value.endswith("m") else float(value)
            return pods["metric"]["name"], number
        if kind == "ScaledObject":
            (trigger,) = doc["spec"]["triggers"]
            return None, float(trigger["metadata"]["threshold"])
    raise AssertionError("no autoscaler")


@pytest.mark.parametrize("variant", [name for name, _ in _variants()])
def test_autoscaling_target_is_below_queueing(variant: str) -> None:
    """Pods are added while the kernels are still keeping up (active executions per pod
    above the pool size means cells wait for a kernel)."""
    objects = dict(_variants())[variant]
    name, per_pod = _target(objects)
    assert name in (METRIC, None)
    assert 0 < per_pod <= 0.8 * _settings(objects).pool_size


def test_adapter_rule_and_keda_query_serve_the_hpa_metric() -> None:
    (values,) = _load(KUBE / "monitoring" / "prometheus-adapter-values.yaml")
    (rule,) = values["rules"]["custom"]
    series = re.match(r"^(\w+)\{", rule["seriesQuery"])
    assert series is not None
    go_template = rule["name"]["as"].replace("${", "\\g<").replace("}", ">")
    exposed = re.sub(rule["name"]["matches"], go_template, series.group(1))
    assert exposed == series.group(1) == METRIC
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    (scaled,) = _load(KUBE / "keda" / "scaledobject.yaml")
    assert METRIC in scaled["spec"]["triggers"][0]["metadata"]["query"]


@pytest.fixture(scope="module")
def manifest_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A worker started with the Deployment's environment and args (one kernel instead of
    the pool, loopback ports instead of the pod's), with a token as the Secret gives it."""
    objects = _base()
    env = {name: e["value"] for name, e in _env(objects).items() if "value" in e}
    env |= {"STRATA_KERNEL_WORKER_POOL_SIZE": "1", "STRATA_KERNEL_WORKER_SPARES": "0",
            "STRATA_WORKER_TOKEN": "manifest-token"}  # fmt: skip
    args = list(_container(objects)["args"])
    port = free_port()
    args[args.index("--metrics-port") + 1] = str(port)
    w = start_worker(tmp_path_factory, *args, env=env)
    w.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield w
    w.stop()


def test_probes_and_scrape_need_no_token_and_the_metric_is_served(manifest_worker: Any) -> None:
    """What the kubelet (no Authorization header) and Prometheus get from a worker set up as
    the Deployment sets it, and the metric the autoscaler targets, in the real output."""
    container = _container(_base())
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        path = container[probe]["httpGet"]["path"]
        assert httpx.get(manifest_worker.url + path, timeout=10).status_code == 200, path
    # the token-gated route would refuse Prometheus: it scrapes the metrics port
    assert httpx.get(manifest_worker.url + "/metrics", timeout=10).status_code == 401
    scraped = httpx.get(manifest_worker.metrics_url, timeout=10)
    assert scraped.status_code == 200
    served = {
        line.split("{")[0].split(" ")[0]
        for line in scraped.text.splitlines()
        if line and not line.startswith("#")
    }
    name, _ = _target(objects=_base())
    assert name in served
    (values,) = _load(KUBE / "monitoring" / "prometheus-adapter-values.yaml")
    for rule in values["rules"]["custom"]:
        assert rule["seriesQuery"].split("{")[0] in served
    (scaled,) = _load(KUBE / "keda" / "scaledobject.yaml")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert any(word in served for word in re.findall(r"[a-z_]+", query))


def test_docs_commands_name_files_that_exist() -> None:
    """docs/deployment.md's apply and helm commands point at these files."""
    docs = (KUBE.parent.parent / "docs" / "deployment.md").read_text()
    named = set(re.findall(r"deploy/kubernetes/[\w./-]+", docs))
    assert named, "docs/deployment.md names no manifest"
    ignored = set((KUBE / ".gitignore").read_text().splitlines())
    for path in named:
        if Path(path).name in ignored:  # made by the operator (token.env)
            continue
        assert (KUBE.parent.parent / path.rstrip(".")).exists(), path
    for line in docs.splitlines():
        if line.strip().startswith("kubectl apply -k"):
            shlex.split(line)  # a command a shell can read
