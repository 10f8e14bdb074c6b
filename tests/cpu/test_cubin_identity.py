"""aot/tools/cubin_identity.py on synthetic CUDA ELF images: equal, renamed-only, changed code."""

import struct

from aot.tools.cubin_identity import EM_CUDA, cuda_images, judge, kernel_names, text_digest


def fake_cubin(kernel: str, code: bytes) -> bytes:
    """A minimal 64-bit CUDA ELF: null, .shstrtab, .strtab, .symtab (one function) and .text.<kernel>."""
    shstr = b"\0.shstrtab\0.strtab\0.symtab\0" + f".text.{kernel}\0".encode()
    strtab = b"\0" + kernel.encode() + b"\0"
    symtab = bytes(24) + struct.pack("<IBBHQQ", 1, 0x12, 0, 4, 0, len(code))
    blobs = [shstr, strtab, symtab, code]
    offs, pos = [], 64
    for b in blobs:
        offs.append(pos)
        pos += len(b)
    shoff = pos
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    hdr += struct.pack("<HHIQQQIHHHHHH", 2, EM_CUDA, 1, 0, 0, shoff, 90 << 8, 64, 56, 0, 64, 5, 1)
    # (name offset in .shstrtab, type, link, entsize) of sections 1..4
    heads = [(1, 3, 0, 0), (11, 3, 0, 0), (19, 2, 2, 24), (27, 1, 0, 0)]
    shdrs = bytes(64) + b"".join(
        struct.pack("<IIQQQQIIQQ", n, t, 0, 0, off, len(b), link, 0, 1, ent)
        for (n, t, link, ent), off, b in zip(heads, offs, blobs))
    return hdr + b"".join(blobs) + shdrs


def test_images_found_and_judged():
    a = fake_cubin("kernel_cutlass_kernel_aotkernelssm90_attention_build_classeslocalsX_0", b"\x01\x02" * 64)
    renamed = fake_cubin("kernel_cutlass_kernel_aotkernelssm90kernelX_0", b"\x01\x02" * 64)
    changed = fake_cubin("kernel_cutlass_kernel_aotkernelssm90kernelX_0", b"\x01\x02" * 63 + b"\x01\x03")

    blob = b"host code" + a + b"\x7fELF not cuda" + renamed + b"tail"
    images = [img for _, img in cuda_images(blob)]
    assert images == [a, renamed]
    assert kernel_names(renamed) == ["kernel_cutlass_kernel_aotkernelssm90kernelX_0"]

    assert judge(a, a) == "identical"
    assert judge(a, renamed) == "same-code"
    assert text_digest(a) == text_digest(renamed)
    assert judge(a, changed) == "DIFFERENT"
    assert judge(renamed, changed) == "DIFFERENT"


def test_exports_compare_ignores_only_the_renamed_host_entry(tmp_path):
    import json

    from aot.tools.cubin_identity import compare_exports

    entry = {"prefix": "sbs_sm90a_k", "kernel": "k", "variant": "v", "params": {}, "upstream": None,
             "args": [{"name": "q", "kind": "tensor"}], "ciface": "_mlir_sbs_sm90a_k__mlir_ciface_cutlass_run_old"}
    head = {"abi_version": 1, "library": "sm90a", "target": "sm_90a", "host_arch": "x86_64"}
    before, after = tmp_path / "a.json", tmp_path / "b.json"
    before.write_text(json.dumps({**head, "kernels": [entry]}))
    after.write_text(json.dumps({**head, "kernels": [{**entry, "ciface": entry["ciface"].replace("old", "new")}]}))
    assert compare_exports(before, after) == []
    after.write_text(json.dumps({**head, "kernels": [{**entry, "args": []}]}))
    assert compare_exports(before, after) == ["sbs_sm90a_k: args differs"]
    # an added export: a difference, unless the change is meant to add variants (--allow-added);
    # a removed one always is
    extra = {**entry, "prefix": "sbs_sm90a_k2", "ciface": "_mlir_sbs_sm90a_k2__mlir_ciface_x"}
    after.write_text(json.dumps({**head, "kernels": [entry, extra]}))
    assert compare_exports(before, after) == ["exports added: ['sbs_sm90a_k2']"]
    assert compare_exports(before, after, allow_added=True) == []
    assert compare_exports(after, before, allow_added=True) == ["exports removed: ['sbs_sm90a_k2']"]
    after.write_text(json.dumps({**head, "kernels": [extra, entry]}))
    before.write_text(json.dumps({**head, "kernels": [entry, extra]}))
    assert compare_exports(before, after) == ["exports in another order"]
