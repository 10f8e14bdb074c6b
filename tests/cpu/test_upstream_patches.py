"""The build-time patch rule of aot/upstream/patches.py (the SM120 K/V stage-reuse fence), on
synthetic source texts: it must patch exactly the pinned bytes, refuse anything else with an error
naming the file and the anchor, and do nothing when the fence is already there (a fixed release)."""

from __future__ import annotations

import hashlib
import json

import pytest

from aot.upstream import patches

K = "            K_pipeline.consumer_release(K_consumer_state)"
V = "            V_pipeline.consumer_release(V_consumer_state)"
SOURCE = (
    "import cutlass.cute as cute\n\n"
    "def consumer():\n"
    "        for n in range(4):\n"
    "            read_k()\n\n"
    f"{K}\n"
    "            K_consumer_state.advance()\n"
    "            read_v()\n"
    f"{V}\n"
    "            V_consumer_state.advance()\n"
)


def _patch(text: str = SOURCE, **kw) -> patches.SourcePatch:
    args = dict(module="m", relpath="pkg/kernel.py", sha256=hashlib.sha256(text.encode()).hexdigest(),
                anchors=(K, V), statement=patches.FENCE, reason="test", upstream_commit="abc")
    args.update(kw)
    return patches.SourcePatch(**args)


def test_inserts_the_fence_before_each_release_with_its_indentation():
    res = patches.apply(_patch(), SOURCE)
    assert res.status == "patched"
    lines = res.text.splitlines()
    for anchor in (K, V):
        i = lines.index(anchor)
        assert lines[i - 1] == "            " + patches.FENCE
    assert res.text.count(patches.FENCE) == 2
    # nothing else changed: removing the two inserted lines gives the original back
    assert res.text.replace("            " + patches.FENCE + "\n", "") == SOURCE
    assert res.original_sha256 == hashlib.sha256(SOURCE.encode()).hexdigest()
    assert res.patched_sha256 == hashlib.sha256(res.text.encode()).hexdigest() != res.original_sha256


def test_already_fixed_source_is_left_alone():
    fixed = patches.apply(_patch(), SOURCE).text
    # a future release with the fix has other bytes than the pin: the rule must not need the digest
    res = patches.apply(_patch(sha256="0" * 64), fixed)
    assert res.status == "already-fixed"
    assert res.text == fixed and res.patched_sha256 == res.original_sha256
    # a blank line between the fence and the release still counts as "right before"
    spaced = fixed.replace(patches.FENCE + "\n", patches.FENCE + "\n\n")
    assert patches.apply(_patch(sha256="0" * 64), spaced).status == "already-fixed"


def test_wrong_digest_fails_naming_the_file():
    changed = SOURCE.replace("read_k()", "read_k(1)")
    with pytest.raises(patches.UpstreamPatchError, match=r"kernel\.py: sha256 [0-9a-f]{64} is not the pinned"):
        patches.apply(_patch(), changed, filename="/site/pkg/kernel.py")


def test_missing_anchor_fails_naming_it():
    text = SOURCE.replace(V, V.replace("            ", "        "))  # re-indented: not the anchor
    with pytest.raises(patches.UpstreamPatchError,
                       match=r"kernel\.py: anchor line 'V_pipeline\.consumer_release\(V_consumer_state\)'"
                             r" \(exact indentation\) occurs 0 times"):
        patches.apply(_patch(text), text)


def test_duplicate_anchor_fails():
    text = SOURCE + K + "\n"
    with pytest.raises(patches.UpstreamPatchError, match=r"anchor line 'K_pipeline.*occurs 2 times"):
        patches.apply(_patch(text), text)


def test_half_fixed_source_fails():
    half = SOURCE.replace(K, "            " + patches.FENCE + "\n" + K)
    with pytest.raises(patches.UpstreamPatchError, match=r"present before .* but not before the other anchors"):
        patches.apply(_patch(half), half)


def test_pins_cover_both_sm120_kernels():
    mods = {p.module.rsplit(".", 1)[1]: p for p in patches.PATCHES}
    assert set(mods) == {"flash_fwd_sm120", "flash_fwd_sm120_sage"}
    for p in mods.values():
        assert p.anchors == (K, V) and p.statement == "cute.arch.fence_view_async_shared()"
        assert p.upstream_commit == "33a9d8720800e7497838f2445896a06c270aa2ef"
        assert len(p.sha256) == 64
    assert {k for p in patches.PATCHES for k in p.kernels} == {"fi_sm120_bf16_fwd", "fi_sm120_sage_fwd"}


def test_manifest_records_patches_and_unvalidated_label(tmp_path, monkeypatch):
    from aot import manifest

    pkg = tmp_path / "flashinfer"
    (pkg / "pkg").mkdir(parents=True)
    (pkg / "pkg" / "kernel.py").write_text(SOURCE)
    p = _patch(kernels=("fi_sm120_bf16_fwd",))
    monkeypatch.setattr(patches, "PATCHES", (p,))
    from aot.upstream import flashinfer_import

    monkeypatch.setattr(flashinfer_import, "package_dir", lambda: pkg)
    targets = {"sm_120a": {"kernels": [{"kernel": "fi_sm120_bf16_fwd"}]},
               "sm_90a": {"kernels": [{"kernel": "attn"}]}}
    recs = manifest.upstream_patches(targets)
    assert len(recs) == 1
    r = recs[0]
    assert r["file"] == "flashinfer/pkg/kernel.py" and r["status"] == "patched"
    assert r["targets"] == ["sm_120a"] and r["original_sha256"] == p.sha256
    assert r["upstream_commit"] == "abc" and "fence_view_async_shared" in r["change"]
    json.dumps(recs)
    assert manifest.upstream_patches({"sm_90a": {"kernels": [{"kernel": "attn"}]}}) == []
    assert manifest.UNVALIDATED["sm_120f"]["sage_fp8"]["capabilities"] == ["12.1"]
