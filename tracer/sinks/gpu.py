"""NVML GPU gauges, read at scrape time: utilization (kernels and memory controller), memory,
power and temperature per GPU.

Without a GPU, a driver or the NVML library, the collector exports nothing and never raises
(docs/reference.md, "Metrics"): a CPU-only server's /metrics simply has no `llm_gpu_*`
series. A reading a GPU does not support (power on some boards, anything under MIG) is left
out for that GPU only.
"""
from __future__ import annotations

import enum
import threading

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

# (name, help) in the order they are exported; all labelled by `gpu` index.
GPU_METRICS = (
    ("llm_gpu_utilization_ratio", "Fraction of the last sample period a kernel was running (0-1)"),
    ("llm_gpu_memory_controller_utilization_ratio",
     "Fraction of the last sample period device memory was being read or written (0-1)"),
    ("llm_gpu_memory_used_bytes", "GPU memory in use"),
    ("llm_gpu_memory_total_bytes", "GPU memory installed"),
    ("llm_gpu_power_watts", "GPU power draw"),
    ("llm_gpu_temperature_celsius", "GPU core temperature"),
)


class NvmlStatus(enum.Enum):
    UNINITIALIZED = "uninitialized"   # nvmlInit not tried yet: done lazily on the first scrape
    READY = "ready"
    UNAVAILABLE = "unavailable"       # no library, no driver or no GPU: export nothing, for good
    CLOSED = "closed"


class GpuCollector:
    """A prometheus_client collector of NVML readings, one series per GPU index.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> registry = CollectorRegistry()
    >>> collector = GpuCollector(registry)      # nvml=pynvml by default
    >>> body = generate_latest(registry)         # no GPU here: no llm_gpu_* lines, no error
    >>> collector.close()
    """

    def __init__(self, registry: CollectorRegistry | None = None, nvml=None) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self.status = NvmlStatus.UNINITIALIZED
        if registry is not None:
            registry.register(self)

    def describe(self) -> list:
        # Empty on purpose: the registry would otherwise call collect() (and NVML) at register.
        return []

    def collect(self):
        if not self._ensure_ready():
            return
        readings = self._read_all()
        for (name, doc), samples in zip(GPU_METRICS, readings):
            if samples:
                family = GaugeMetricFamily(name, doc, labels=["gpu"])
                for gpu_index, value in samples:
                    family.add_metric([str(gpu_index)], value)
                yield family

    def close(self) -> None:
        with self._lock:
            if self.status is NvmlStatus.READY:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # noqa: BLE001 - shutting down must not raise either
                    pass
            self.status = NvmlStatus.CLOSED

    def _ensure_ready(self) -> bool:
        with self._lock:
            if self.status is NvmlStatus.UNINITIALIZED:
                self.status = self._init()
            return self.status is NvmlStatus.READY

    def _init(self) -> NvmlStatus:
        try:
            if self._nvml is None:
                import pynvml  # nvidia-ml-py; loads libnvidia-ml lazily in nvmlInit
                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, OSError…
            return NvmlStatus.UNAVAILABLE
        return NvmlStatus.READY

    def _read_all(self) -> tuple[list, ...]:
        """Per metric, a list of (gpu index, value); a failing call drops only its own value."""
        readings: tuple[list, ...] = tuple([] for _ in GPU_METRICS)
        nvml = self._nvml
        try:
            num_gpus = nvml.nvmlDeviceGetCount()
        except Exception:  # noqa: BLE001
            return readings
        for i in range(num_gpus):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except Exception:  # noqa: BLE001 - e.g. a GPU fallen off the bus
                continue
            for samples, read in zip(readings, _READERS):
                try:
                    samples.append((i, read(nvml, handle)))
                except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED and friends
                    pass
        return readings


def _utilization_ratio(nvml, handle) -> float:
    return nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0  # NVML reports percent


def _memory_controller_utilization_ratio(nvml, handle) -> float:
    # The same NVML call as the kernel utilisation: its `memory` field, also in percent.
    return nvml.nvmlDeviceGetUtilizationRates(handle).memory / 100.0


def _memory_used_bytes(nvml, handle) -> float:
    return float(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def _memory_total_bytes(nvml, handle) -> float:
    return float(nvml.nvmlDeviceGetMemoryInfo(handle).total)


def _power_watts(nvml, handle) -> float:
    return nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # NVML reports milliwatts


def _temperature_celsius(nvml, handle) -> float:
    return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))


_READERS = (_utilization_ratio, _memory_controller_utilization_ratio, _memory_used_bytes,
            _memory_total_bytes, _power_watts, _temperature_celsius)
