"""SM clock and board power while a benchmark row runs (NVML through nvidia-ml-py, optional).

Why the benchmark needs this: on our H200 every sparse-attention row runs into the board's
700 W limit. The driver then lowers the SM clock (1.6-1.8 GHz instead of 1.98 GHz), so the
kernel's time follows its energy per call, not only its cycles. A time without the clock and the
cap state cannot be compared across runs, machines or kernel versions (MEASUREMENTS.md). Nothing here is needed to run attention: without nvidia-ml-py (`pip install
"subblock-sage[bench]"`) or without NVML, `Sampler.available` is False and `summary()` is None.

Why it ships (while the lab's contenders do not): `subblock-sage bench` shows the clock and power
of every row to users with the ``[bench]`` extra, and the project's lab (benchmark/lab, the
benchmark scripts) samples with this same module, so there is one implementation, here, below
both; the runtime never imports the lab.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

# nvmlClocksEventReason* bits that mean "the clock is held down" (not idle / app settings)
_SLOWDOWN_REASONS = {
    0x4: "power cap",  # SwPowerCap
    0x8: "hw slowdown",  # HwSlowdown
    0x20: "sw thermal",  # SwThermalSlowdown
    0x40: "hw thermal",  # HwThermalSlowdown
    0x80: "power brake",  # HwPowerBrakeSlowdown
}


@dataclass(frozen=True)
class PowerSummary:
    """Medians over the samples taken while the timed calls ran."""

    sm_mhz: int
    watts: float
    slowed: float  # fraction of samples with a slowdown reason active (power cap, thermal, ...)
    reason: str  # the most frequent slowdown reason, "" when none was seen
    samples: int

    def as_row(self) -> dict:
        """The benchmark table's columns."""
        slowed = f"{self.slowed:.0%} {self.reason}" if self.reason else "0%"
        return {"MHz": self.sm_mhz, "W": round(self.watts), "slowed": slowed}


def _nvml():
    """The pynvml module with NVML initialised, or None (not installed, no driver, no permission)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any NVML failure just means "no readings"
        return None
    return pynvml


def _handle(nvml, device_index: int):
    """NVML handle of the CUDA device: found by UUID (CUDA and NVML may number GPUs differently,
    e.g. under CUDA_VISIBLE_DEVICES), by index if the UUID is not available."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # noqa: BLE001
        return nvml.nvmlDeviceGetHandleByIndex(device_index)


def _reasons(nvml, handle) -> int:
    get = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(get(handle))


class Sampler:
    """Context manager: samples the SM clock, the board power and the clock slowdown reasons
    every ``interval_s`` on a background thread while the block runs.

        with Sampler(0) as s:
            time_ms(fn)
        s.summary()  # PowerSummary, or None without NVML
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.02):
        self.interval_s = interval_s
        self._nvml = _nvml()
        self._handle = None
        if self._nvml is not None:
            try:
                self._handle = _handle(self._nvml, device_index)
            except Exception:  # noqa: BLE001
                self._nvml = None
        self._samples: list[tuple[int, float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def sample(self) -> tuple[int, float, int]:
        """(SM clock in MHz, board power in W, slowdown-reason bits) now."""
        nvml, h = self._nvml, self._handle
        mhz = int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        watts = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        return mhz, watts, _reasons(nvml, h)

    def _run(self):
        while not self._stop.is_set():
            try:
                self._samples.append(self.sample())
            except Exception:  # noqa: BLE001 - a failed reading is skipped
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._samples = []
        if self.available:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="subblock-sage-power", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            try:  # at least one reading from the end of the block (short blocks, slow first sample)
                self._samples.append(self.sample())
            except Exception:  # noqa: BLE001
                pass

    @property
    def samples(self) -> list[tuple[int, float, int]]:
        """The (MHz, W, reason bits) readings of the last block (to pool over several blocks)."""
        return list(self._samples)

    def summary(self) -> PowerSummary | None:
        return summarize(self._samples)


def summarize(samples) -> PowerSummary | None:
    """PowerSummary of (MHz, W, reason bits) samples; None for no samples."""
    if not samples:
        return None
    counts: dict[str, int] = {}
    slowed = 0
    for _, _, bits in samples:
        hit = [name for bit, name in _SLOWDOWN_REASONS.items() if bits & bit]
        slowed += bool(hit)
        for name in hit:
            counts[name] = counts.get(name, 0) + 1
    reason = max(counts, key=counts.get) if counts else ""
    return PowerSummary(
        sm_mhz=int(statistics.median(s[0] for s in samples)),
        watts=float(statistics.median(s[1] for s in samples)),
        slowed=slowed / len(samples),
        reason=reason,
        samples=len(samples),
    )

