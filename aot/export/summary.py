"""The export times of a build directory, slowest first (printed after every build)."""

from __future__ import annotations

import json
from pathlib import Path


def summary(build_dir: Path, slowest: int = 8) -> str:
    """What the last build's export units cost: counts, compile vs cache time, the slowest."""
    rows = []
    for f in sorted(build_dir.glob("aot/*/*.time.json")):
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not rows:
        return "exports: none recorded"
    compiled = [r for r in rows if not r["cached"]]
    hits = len(rows) - len(compiled)
    total = sum(r["seconds"] for r in rows)
    cpu = sum(r.get("cpu_seconds", 0.0) for r in rows)
    out = [f"exports: {len(rows)} units, {len(compiled)} compiled, {hits} from the export cache; "
           f"{total:.0f} s wall, {cpu:.0f} CPU-s in all (last run of each unit)"]
    for r in sorted(rows, key=lambda r: -r["seconds"])[:slowest]:
        out.append(f"  {r['seconds']:7.1f} s  {r.get('cpu_seconds', 0.0):6.1f} CPU-s  {r['prefix']} "
                   f"({r['host_arch']}{', cache hit' if r['cached'] else ''})")
    return "\n".join(out)
