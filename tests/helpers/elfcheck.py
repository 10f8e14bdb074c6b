"""ELF facts about a kernel library: embedded cubins' SM (e_flags), NEEDED, GLIBC versions,
exported symbols, a kernel's registers and stack frames. Uses pyelftools; the cubins are found by
scanning for embedded ELF images."""

from __future__ import annotations

import struct
from pathlib import Path

EM_CUDA = 190


def embedded_cubin_sms(path: Path) -> list[int]:
    """SM numbers (e.g. 90, 100, 120) of every CUDA ELF image embedded in the file."""
    data = Path(path).read_bytes()
    sms, i = [], 0
    while (i := data.find(b"\x7fELF", i + 1)) > 0:
        if data[i + 4] != 2:  # ELFCLASS64
            continue
        (e_machine,) = struct.unpack_from("<H", data, i + 18)
        if e_machine == EM_CUDA:
            (e_flags,) = struct.unpack_from("<I", data, i + 48)
            sms.append((e_flags >> 8) & 0xFF)
    return sms


def dynamic_info(path: Path) -> dict:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with open(path, "rb") as f:
        elf = ELFFile(f)
        needed, glibc, exported = [], set(), []
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                needed += [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
            if isinstance(sec, GNUVerNeedSection):
                for _, auxs in sec.iter_versions():
                    glibc |= {a.name for a in auxs if a.name.startswith("GLIBC_")}
        dynsym = elf.get_section_by_name(".dynsym")
        for sym in dynsym.iter_symbols():
            if sym["st_shndx"] != "SHN_UNDEF" and sym["st_info"]["bind"] == "STB_GLOBAL" and sym.name:
                exported.append(sym.name)
        return {
            "machine": elf["e_machine"],
            "needed": sorted(needed),
            "glibc": sorted(glibc, key=lambda v: tuple(int(x) for x in v[6:].split("."))),
            "exported": sorted(exported),
        }


def glibc_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.removeprefix("GLIBC_").split("."))


def regs_and_frames(obj: Path) -> tuple[int, list[int]]:
    """(registers, frame sizes) from the .nv.info sections of the cubin embedded in one export
    of one kernel."""
    regs, frames = kernels_regs_and_frames(obj)
    assert len(regs) == 1, regs
    return regs[0], frames


def kernels_regs_and_frames(obj: Path) -> tuple[list[int], list[int]]:
    """(registers of each kernel, frame sizes) of one export whose cubin holds several kernels."""
    from aot.tools.cubin_identity import _sections, cuda_images

    regs, frames = [], []
    for _, img in cuda_images(obj.read_bytes()):
        for s in _sections(img):
            if not s["sname"].startswith(".nv.info"):
                continue
            d, i = s["data"], 0
            while i + 4 <= len(d):
                fmt, attr = d[i], d[i + 1]
                if fmt != 4:  # EIFMT_SVAL carries a 16-bit size and a payload; others are 4 bytes
                    i += 4
                    continue
                size = struct.unpack_from("<H", d, i + 2)[0]
                if attr in (0x2F, 0x11) and size >= 8:  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE
                    (regs if attr == 0x2F else frames).append(struct.unpack_from("<I", d, i + 8)[0])
                i += 4 + size
    return regs, frames
