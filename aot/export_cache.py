"""Content-addressed cache of AOT exports (ccache for the CuTe DSL), shared by every clone and CI
run of one machine.

Why: an export is a pure function of (kernel module and the repository files it reads, the pinned
DSL / FlashInfer versions, the compile options, the host CPU), yet a clean clone re-ran all of them
(minutes on 2 cores). Here each export is stored once, outside the repository, and a later build
with the same inputs copies the object, header and argument layout instead of compiling.

Lookup without importing anything heavy ("direct mode", as ccache calls it): the *unit key* hashes
what identifies an export before any import (kernel module, kernel, variant, target, host CPU,
DSL/FlashInfer/CUDA-binding versions, Python version, compile-relevant environment variables).
It points to a small list of candidate dependency sets recorded by earlier compiles: the repository
files the export actually opened (its kernel module, shared helpers, the registry, FlashInfer patch
rules, ...) with their sha256. When every file of a candidate still has its recorded digest, the
candidate's *result* (object, header, layout JSON) is valid. A result is verified against the
sha256 values stored with it on every read, so a corrupted or half-written entry is a miss, never
a wrong library.

Concurrency: results are written into a private temporary directory and renamed into place (atomic;
a concurrent writer of the same key just drops its copy, the bytes are the same). The candidate
lists, the statistics and eviction are updated under one ``flock``. Size bound: least recently
used results (by the mtime of their ``meta.json``, touched on every hit) are evicted once the cache
exceeds ``SBS_EXPORT_CACHE_SIZE``.

Environment:
  SBS_EXPORT_CACHE        cache folder; ``off`` (or ``0``) disables it. Default:
                          ``$XDG_CACHE_HOME/subblock-sage/exports`` (``~/.cache/...``).
  SBS_EXPORT_CACHE_SIZE   size bound, e.g. ``4G`` (default), ``500M``.

CLI: ``python -m aot.export_cache {stats,clear,path}``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from aot.contract import sha256_file

SCHEMA = 1
ROOT = Path(__file__).resolve().parent.parent
MAX_CANDIDATES = 8  # dependency sets remembered per unit (e.g. branches switched back and forth)
DEFAULT_SIZE = 4 << 30


def cache_dir() -> Path | None:
    env = os.environ.get("SBS_EXPORT_CACHE", "")
    if env.lower() in ("off", "0", "no", "false"):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "subblock-sage" / "exports"


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise ValueError(
            f"SBS_EXPORT_CACHE_SIZE={text!r} is not a size. Fix: use e.g. 4G, 500M or 1048576"
        ) from None


def max_size() -> int:
    env = os.environ.get("SBS_EXPORT_CACHE_SIZE")
    return parse_size(env) if env else DEFAULT_SIZE


# sha256 per (path, mtime_ns, size, inode, device): every lookup hashes its unit's dependencies,
# so one process hashing the same repository files for each of its units read each of them once per
# unit (tests/cpu/test_export_inputs.py: 54,846 hashes, 31 s on the 2-core build machine; 25 s for
# its whole file with this table). A rewritten file has a new mtime, so it is hashed again; a file
# written in the last 2 s is not kept (file times can be as coarse as a kernel tick: two writes of
# the same size within one would share a key, git's "racily clean" case).
RACY_NS = 2_000_000_000
_HASHES: dict[tuple, str] = {}


def file_sha256(path: Path) -> str | None:
    """The file's sha256 (the contract's :func:`sha256_file`), or None where it cannot be read."""
    try:
        st = os.stat(path)
        key = (os.fspath(path), st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
        got = _HASHES.get(key)
        if got is None:
            got = sha256_file(path)
            if st.st_mtime_ns < time.time_ns() - RACY_NS:
                _HASHES[key] = got
        return got
    except OSError:
        return None


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


class Cache:
    def __init__(self, root: Path, limit: int | None = None):
        self.root = root
        self.limit = max_size() if limit is None else limit

    # -- layout
    def _unit_file(self, unit_key: str) -> Path:
        return self.root / "units" / unit_key[:2] / f"{unit_key}.json"

    def _result_dir(self, result_key: str) -> Path:
        return self.root / "results" / result_key[:2] / result_key

    @contextlib.contextmanager
    def _locked(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _write_atomic(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def _bump(self, key: str) -> None:
        with self._locked():
            p = self.root / "stats.json"
            try:
                stats = json.loads(p.read_text())
            except (OSError, ValueError):
                stats = {}
            stats[key] = stats.get(key, 0) + 1
            self._write_atomic(p, json.dumps(stats, sort_keys=True) + "\n")

    # -- read
    def lookup(self, unit_key: str, src_root: Path = ROOT,
               count: bool = True) -> tuple[Path, dict[str, str]] | None:
        """(verified result folder, its dependency digests) or None. Counts a hit or a miss
        (unless ``count`` is False: a probe before pre-filling another host CPU's unit)."""
        try:
            cands = json.loads(self._unit_file(unit_key).read_text())["candidates"]
        except (OSError, ValueError, KeyError):
            cands = []
        for cand in reversed(cands):  # newest first
            deps = cand["deps"]
            if all(file_sha256(src_root / rel) == sha for rel, sha in deps.items()):
                entry = self._result_dir(cand["result"])
                if self._verify(entry):
                    os.utime(entry / "meta.json")  # LRU
                    if count:
                        self._bump("hits")
                    return entry, deps
        if count:
            self._bump("misses")
        return None

    def _verify(self, entry: Path) -> bool:
        try:
            meta = json.loads((entry / "meta.json").read_text())
        except (OSError, ValueError):
            return False
        ok = all(file_sha256(entry / name) == sha for name, sha in meta["files"].items())
        if not ok:
            print(f"export cache: {entry} fails its sha256 check; dropped (will recompile)",
                  file=sys.stderr)
            self._bump("corrupt")
            shutil.rmtree(entry, ignore_errors=True)
        return ok

    @staticmethod
    def fetch(entry: Path, out_dir: Path) -> list[str]:
        """Copy a verified result's files into ``out_dir`` (each checked against its stored
        sha256 again after the copy, then renamed into place atomically)."""
        meta = json.loads((entry / "meta.json").read_text())
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, sha in sorted(meta["files"].items()):
            tmp = out_dir / f".{name}.tmp"
            shutil.copyfile(entry / name, tmp)
            if file_sha256(tmp) != sha:  # changed under us (eviction, concurrent clear)
                tmp.unlink(missing_ok=True)
                raise OSError(f"export cache: {entry / name} changed while being read")
            os.replace(tmp, out_dir / name)
        return sorted(meta["files"])

    # -- write
    def store(self, unit_key: str, deps: dict[str, str], files: dict[str, Path]) -> None:
        result_key = digest({"unit": unit_key, "deps": deps})
        final = self._result_dir(result_key)
        if not final.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
            sums, size = {}, 0
            for name, src in files.items():
                shutil.copyfile(src, tmp / name)
                sums[name] = file_sha256(tmp / name)
                size += (tmp / name).stat().st_size
            (tmp / "meta.json").write_text(json.dumps(
                {"schema": SCHEMA, "unit": unit_key, "files": sums, "size": size}, sort_keys=True))
            try:
                os.rename(tmp, final)
            except OSError:  # a concurrent build stored the same result first
                shutil.rmtree(tmp, ignore_errors=True)
        with self._locked():
            uf = self._unit_file(unit_key)
            try:
                cands = json.loads(uf.read_text())["candidates"]
            except (OSError, ValueError, KeyError):
                cands = []
            cands = [c for c in cands if c["result"] != result_key]
            cands.append({"deps": deps, "result": result_key})
            self._write_atomic(uf, json.dumps({"candidates": cands[-MAX_CANDIDATES:]},
                                              sort_keys=True) + "\n")
            self._evict_locked()

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        for meta in self.root.glob("results/*/*/meta.json"):
            try:
                st = meta.stat()
                out.append((st.st_mtime, json.loads(meta.read_text())["size"], meta.parent))
            except (OSError, ValueError, KeyError):
                continue
        return out

    def _evict_locked(self) -> int:
        entries = sorted(self._entries())
        total = sum(s for _, s, _ in entries)
        evicted = 0
        while entries and total > self.limit:
            _, size, path = entries.pop(0)
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            evicted += 1
        if evicted:
            p = self.root / "stats.json"
            try:
                stats = json.loads(p.read_text())
            except (OSError, ValueError):
                stats = {}
            stats["evicted"] = stats.get("evicted", 0) + evicted
            self._write_atomic(p, json.dumps(stats, sort_keys=True) + "\n")
        return evicted

    # -- CLI
    def stats(self) -> dict:
        entries = self._entries()
        try:
            counters = json.loads((self.root / "stats.json").read_text())
        except (OSError, ValueError):
            counters = {}
        return {"path": str(self.root), "results": len(entries),
                "bytes": sum(s for _, s, _ in entries), "limit_bytes": self.limit,
                "hits": counters.get("hits", 0), "misses": counters.get("misses", 0),
                "evicted": counters.get("evicted", 0), "corrupt": counters.get("corrupt", 0)}

    def clear(self) -> None:
        with self._locked():
            for sub in ("results", "units"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
            (self.root / "stats.json").unlink(missing_ok=True)


def default_cache() -> Cache | None:
    d = cache_dir()
    return Cache(d) if d else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.export_cache",
                                 description="Inspect or clear the AOT export cache.")
    ap.add_argument("cmd", choices=("stats", "clear", "path"))
    ns = ap.parse_args(argv)
    cache = default_cache()
    if cache is None:
        print("export cache is off (SBS_EXPORT_CACHE=off)")
        return 0
    if ns.cmd == "path":
        print(cache.root)
    elif ns.cmd == "clear":
        cache.clear()
        print(f"cleared {cache.root}")
    else:
        s = cache.stats()
        looks = s["hits"] + s["misses"]
        rate = f" ({100 * s['hits'] / looks:.0f}% hits)" if looks else ""
        print(f"export cache {s['path']}\n"
              f"  results   {s['results']} ({s['bytes'] / 2**20:.1f} MiB of "
              f"{s['limit_bytes'] / 2**20:.0f} MiB)\n"
              f"  lookups   {s['hits']} hits, {s['misses']} misses{rate}\n"
              f"  evicted   {s['evicted']}, corrupt entries dropped {s['corrupt']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
