"""Are the GPU kernels of two builds the same? Compares the CUDA ELF images (cubins) embedded in
the exported objects (``<build>/aot/<lib>/<prefix>.o``) and linked libraries of two CMake build
directories, export by export, and the exports' argument layouts (``exports.json``).

Written for moves of kernel source (e.g. a kernel class out of a builder closure into a module
of its own), which must not change a single instruction. CuTe-DSL names a kernel after
its Python object (``kernel_cutlass_kernel_<module><class>_object_at_<args>``) and the host entry
(``ciface``) likewise, so a move renames them. Each image is therefore judged twice:

- ``identical``: the image bytes are equal;
- ``same-code``: not byte-equal, but every section is equal once the kernel's name is replaced by
  a placeholder: section contents (the SASS in ``.text.*``, ``.nv.info*``, constants,
  relocations), section and program header fields other than name and file offsets, and the
  symbol and string tables with names normalised. Only names differ;
- ``DIFFERENT``: anything else (the script exits 1).

No disassembler is needed (none is installed here); only the ELF structure is read.

Usage (two builds of ``-DSBS_TARGETS=sm_90a``; ``aot/tools/cubin_identity.sh [REV]`` makes them
and runs this; docs/design/kernels-sm90.md, "Checking a kernel change without a GPU"):

    python -m aot.tools.cubin_identity BEFORE_BUILD AFTER_BUILD [--lib sm90a] [--markdown]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path

EM_CUDA = 190
_SHT_SYMTAB, _SHT_STRTAB = 2, 3


def cuda_images(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, image) of every 64-bit CUDA ELF image embedded in ``data``; an image ends where
    the last of its header tables or sections ends."""
    out, i = [], 0
    while (i := data.find(b"\x7fELF", i + 1)) > 0:
        if data[i + 4] != 2 or struct.unpack_from("<H", data, i + 18)[0] != EM_CUDA:
            continue
        phoff, shoff = struct.unpack_from("<QQ", data, i + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, i + 0x36)
        end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        for k in range(shnum):
            sh_type, = struct.unpack_from("<I", data, i + shoff + k * shentsize + 4)
            off, size = struct.unpack_from("<QQ", data, i + shoff + k * shentsize + 24)
            if sh_type != 8:  # NOBITS occupies no file space
                end = max(end, off + size)
        out.append((i, data[i:i + end]))
    return out


def _sections(img: bytes) -> list[dict]:
    (shoff,) = struct.unpack_from("<Q", img, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", img, 0x3A)
    secs = []
    for k in range(shnum):
        f = struct.unpack_from("<IIQQQQIIQQ", img, shoff + k * shentsize)
        secs.append(dict(zip(("name", "type", "flags", "addr", "offset", "size", "link", "info",
                              "align", "entsize"), f)))
    for s in secs:
        s["data"] = img[s["offset"]:s["offset"] + s["size"]] if s["type"] != 8 else b""  # NOBITS
    names = secs[shstrndx]["data"]
    for s in secs:
        s["sname"] = names[s["name"]:names.index(b"\0", s["name"])].decode()
    return secs


def _cstr(tab: bytes, off: int) -> str:
    return tab[off:tab.index(b"\0", off)].decode()


def kernel_names(img: bytes) -> list[str]:
    """The names of the image's kernels (from its ``.text.<name>`` sections), longest first."""
    names = [s["sname"][len(".text."):] for s in _sections(img) if s["sname"].startswith(".text.")]
    return sorted(names, key=len, reverse=True)


def _normal_form(img: bytes) -> list:
    """The image with kernel names replaced by placeholders and file offsets left out."""
    secs = _sections(img)
    names = kernel_names(img)

    def norm(s: str) -> str:
        for n, name in enumerate(names):
            s = s.replace(name, f"<kernel{n}>")
        return s

    phoff, = struct.unpack_from("<Q", img, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", img, 0x36)
    # program headers: type, flags, vaddr, paddr, filesz, memsz, align (not the file offset)
    phdrs = [struct.unpack_from("<IIQQQQQQ", img, phoff + k * phentsize) for k in range(phnum)]
    form = [img[:0x20], img[0x30:0x36], [p[:2] + p[3:] for p in phdrs]]
    for s in secs:
        head = (norm(s["sname"]), s["type"], s["flags"], s["addr"], s["link"], s["info"], s["align"],
                s["entsize"])
        if s["type"] == _SHT_STRTAB:
            body = sorted(norm(x.decode()) for x in s["data"].split(b"\0"))
        elif s["type"] == _SHT_SYMTAB:
            strtab = secs[s["link"]]["data"]
            body = []
            for k in range(0, len(s["data"]), 24):
                st_name, rest = struct.unpack_from("<I", s["data"], k)[0], s["data"][k + 4:k + 24]
                body.append((norm(_cstr(strtab, st_name)), rest))
        else:
            body = s["data"]
        form.append((head, body))
    return form


def text_digest(img: bytes) -> str:
    """sha256 of the image's code: every ``.text.*`` section, in order (names left out)."""
    h = hashlib.sha256()
    for s in _sections(img):
        if s["sname"].startswith(".text."):
            h.update(s["data"])
    return h.hexdigest()


def judge(a: bytes, b: bytes) -> str:
    if a == b:
        return "identical"
    return "same-code" if _normal_form(a) == _normal_form(b) else "DIFFERENT"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def compare_file(before: Path, after: Path) -> dict:
    ia, ib = cuda_images(before.read_bytes()), cuda_images(after.read_bytes())
    row = {"file": after.name, "images": len(ib), "verdicts": [],
           "before": [_sha(x)[:16] for _, x in ia], "after": [_sha(x)[:16] for _, x in ib],
           "text_before": [text_digest(x)[:16] for _, x in ia], "text": [text_digest(x)[:16] for _, x in ib]}
    if len(ia) != len(ib):
        row["verdicts"] = [f"DIFFERENT (image count {len(ia)} -> {len(ib)})"]
    else:
        row["verdicts"] = [judge(x, y) for (_, x), (_, y) in zip(ia, ib)]
    return row


def compare_exports(before: Path, after: Path, allow_added: bool = False, ignore: tuple = ()) -> list[str]:
    """Differences between two exports.json beyond the renamed host entry (``ciface``), export by
    export (by prefix). Exports only in ``after`` are a difference unless ``allow_added`` (a change
    that adds variants and should leave the others as they were); removed ones always are.
    ``ignore``: export keys whose change is the point of the change compared (e.g. ``params``
    when the variants record more of their config); listed, not a difference."""
    ea, eb = json.loads(before.read_text()), json.loads(after.read_text())
    problems = []
    for key in ("abi_version", "library", "target", "host_arch"):
        if ea[key] != eb[key]:
            problems.append(f"{key}: {ea[key]!r} -> {eb[key]!r}")
    ka = {k["prefix"]: k for k in ea["kernels"]}
    kb = {k["prefix"]: k for k in eb["kernels"]}
    removed, added = sorted(set(ka) - set(kb)), sorted(set(kb) - set(ka))
    if removed:
        problems.append(f"exports removed: {removed}")
    if added and not allow_added:
        problems.append(f"exports added: {added}")
    common = [p for p in ka if p in kb]
    if common != [p for p in kb if p in ka]:
        problems.append("exports in another order")
    for x, y in ((ka[p], kb[p]) for p in common):
        for key in sorted(set(x) | set(y)):
            if key != "ciface" and key not in ignore and x.get(key) != y.get(key):
                problems.append(f"{x['prefix']}: {key} differs")
        if not (x["ciface"].startswith(f"_mlir_{x['prefix']}__mlir_ciface_")
                and y["ciface"].startswith(f"_mlir_{y['prefix']}__mlir_ciface_")):
            problems.append(f"{x['prefix']}: host entry not of the form _mlir_<prefix>__mlir_ciface_*")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.tools.cubin_identity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path, help="CMake build directory of the reference tree")
    ap.add_argument("after", type=Path, help="CMake build directory of the changed tree")
    ap.add_argument("--lib", action="append", help="library (default: every one in both builds)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--allow-added", action="store_true",
                    help="exports only in AFTER are listed, not a difference (a change that adds variants)")
    ap.add_argument("--ignore-key", action="append", default=[], metavar="KEY",
                    help="an exports.json key per export whose change is intended (e.g. params); repeatable")
    ns = ap.parse_args(argv)
    libs = ns.lib or sorted(p.name for p in (ns.after / "aot").iterdir()
                            if (ns.before / "aot" / p.name / "exports.json").exists())
    rows, problems, added = [], [], []
    for lib in libs:
        da, db = ns.before / "aot" / lib, ns.after / "aot" / lib
        problems += [f"{lib}/exports.json: {p}"
                     for p in compare_exports(da / "exports.json", db / "exports.json", ns.allow_added,
                                              tuple(ns.ignore_key))]
        for prefix in (k["prefix"] for k in json.loads((db / "exports.json").read_text())["kernels"]):
            if not (da / f"{prefix}.o").exists():
                added.append(f"{lib}/{prefix}")
                continue
            rows.append(compare_file(da / f"{prefix}.o", db / f"{prefix}.o"))
        so = f"libsubblock_sage_{lib}.so"
        if added and ns.allow_added:
            pass  # the library holds the added images too; its exports were compared one by one
        elif (ns.before / so).exists() and (ns.after / so).exists():
            rows.append(compare_file(ns.before / so, ns.after / so))
    if ns.markdown:
        print("| file | cubins | verdict | sha256 before | sha256 after | .text sha256 before | after |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        verdict = ",".join(sorted(set(r["verdicts"])))
        if ns.markdown:
            many = len(r["after"]) > 1
            cell = (lambda xs: f"{len(xs)} images" if many else (xs[0] if xs else "-"))
            print(f"| {r['file']} | {r['images']} | {verdict} | {cell(r['before'])} | {cell(r['after'])} "
                  f"| {cell(r['text_before'])} | {cell(r['text'])} |")
        else:
            print(f"{verdict:10s} {r['file']}  {' '.join(r['before'])} -> {' '.join(r['after'])}")
    for p in problems:
        print(f"exports.json: {p}")
    for p in added:
        print(f"ADDED      {p} (only in the changed build)")
    bad = problems or any(v.startswith("DIFFERENT") for r in rows for v in r["verdicts"])
    print("RESULT:", "DIFFERENT" if bad else "same kernels (" + ", ".join(
        sorted({v for r in rows for v in r["verdicts"]})) + ")")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
