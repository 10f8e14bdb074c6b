"""The generated header (``<prefix>.h``) parsed: it is the ground truth of the C argument
structs and of the launch entry's name."""

from __future__ import annotations

import re

_STRUCT_RE = re.compile(r"typedef struct \{(?P<body>[^}]*)\}\s*(?P<name>\w+)_t;", re.S)
_FIELD_RE = re.compile(r"(?P<ctype>\w+)\s+\*?(?P<field>\w+)(?:\[(?P<n>\d+)\])?;")


def parse_header(text: str, prefix: str) -> dict:
    structs = {}
    for m in _STRUCT_RE.finditer(text):
        fields = [
            (f["ctype"], f["field"], int(f["n"]) if f["n"] else None)
            for f in _FIELD_RE.finditer(m["body"])
        ]
        structs[m["name"]] = fields
    wrap = re.search(
        rf"cute_dsl_{prefix}_wrapper\({prefix}_Kernel_Module_t \*module,?(?P<params>[^)]*)\)", text
    )
    if not wrap:
        raise RuntimeError(f"{prefix}: wrapper not found in exported header")
    params = [p.strip() for p in wrap["params"].split(",") if p.strip()]
    ciface = re.search(rf"void (_mlir_{prefix}__mlir_ciface_\w+)\(void \*\*args", text)
    if not ciface:
        raise RuntimeError(f"{prefix}: launch entry not found in exported header")
    return {"structs": structs, "params": params, "ciface": ciface[1]}
