"""GPU gauges: values and units from a fake NVML; nothing, and no error, without a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import pynvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from tracer.sinks.gpu import GPU_METRICS, GpuCollector, NvmlStatus

GIB = 1024 ** 3


class FakeNvml:
    """Two GPUs; GPU 1 cannot report power (as on some boards and under MIG)."""

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, init_error: Exception | None = None, count_error: Exception | None = None,
                 no_utilization: tuple[str, ...] = ()):
        self.init_error, self.count_error = init_error, count_error
        self.no_utilization = no_utilization   # handles that raise NOT_SUPPORTED (MIG)
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        if self.count_error:
            raise self.count_error
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"handle{i}"

    def nvmlDeviceGetUtilizationRates(self, h):
        if h in self.no_utilization:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu={"handle0": 87, "handle1": 3}[h],
                               memory={"handle0": 42, "handle1": 10}[h])

    def nvmlDeviceGetMemoryInfo(self, h):
        used = {"handle0": 60 * GIB, "handle1": 1 * GIB}[h]
        return SimpleNamespace(used=used, total=141 * GIB, free=141 * GIB - used)

    def nvmlDeviceGetPowerUsage(self, h):
        if h == "handle1":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 412_500   # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return {"handle0": 61, "handle1": 34}[h]


def scrape(registry) -> dict:
    text = generate_openmetrics(registry).decode()
    return {(s.name, s.labels.get("gpu")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_values_and_units_from_nvml():
    registry = CollectorRegistry()
    GpuCollector(registry, nvml=FakeNvml())
    values = scrape(registry)
    assert values == {
        ("llm_gpu_utilization_ratio", "0"): 0.87, ("llm_gpu_utilization_ratio", "1"): 0.03,
        ("llm_gpu_memory_controller_utilization_ratio", "0"): 0.42,
        ("llm_gpu_memory_controller_utilization_ratio", "1"): 0.10,
        ("llm_gpu_memory_used_bytes", "0"): 60 * GIB, ("llm_gpu_memory_used_bytes", "1"): GIB,
        ("llm_gpu_memory_total_bytes", "0"): 141 * GIB, ("llm_gpu_memory_total_bytes", "1"): 141 * GIB,
        ("llm_gpu_power_watts", "0"): 412.5,   # GPU 1: not supported -> left out, rest kept
        ("llm_gpu_temperature_celsius", "0"): 61, ("llm_gpu_temperature_celsius", "1"): 34,
    }


def test_utilization_not_supported_is_absent_not_zero_for_that_gpu():
    """Under MIG NVML has no utilisation: both ratios go missing for that GPU only."""
    registry = CollectorRegistry()
    GpuCollector(registry, nvml=FakeNvml(no_utilization=("handle1",)))
    values = scrape(registry)
    for name in ("llm_gpu_utilization_ratio", "llm_gpu_memory_controller_utilization_ratio"):
        assert (name, "1") not in values
    assert values[("llm_gpu_memory_controller_utilization_ratio", "0")] == 0.42
    assert values[("llm_gpu_memory_used_bytes", "1")] == GIB


def test_nvml_is_initialised_once_lazily_and_shut_down_on_close():
    nvml = FakeNvml()
    registry = CollectorRegistry()
    collector = GpuCollector(registry, nvml=nvml)
    assert nvml.calls == [] and collector.status is NvmlStatus.UNINITIALIZED
    scrape(registry)
    scrape(registry)
    assert nvml.calls == ["init"] and collector.status is NvmlStatus.READY
    collector.close()
    assert nvml.calls == ["init", "shutdown"] and collector.status is NvmlStatus.CLOSED
    assert scrape(registry) == {}


def test_missing_library_or_driver_exports_nothing_and_never_raises():
    for error in (pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
                  pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), OSError("no libnvidia-ml")):
        nvml = FakeNvml(init_error=error)
        registry = CollectorRegistry()
        collector = GpuCollector(registry, nvml=nvml)
        assert b"llm_gpu" not in generate_latest(registry)
        assert b"memory_controller" not in generate_latest(registry)   # absent, not zero
        assert scrape(registry) == {}
        assert collector.status is NvmlStatus.UNAVAILABLE
        assert nvml.calls == ["init"]   # not retried on every scrape
        collector.close()
        assert nvml.calls == ["init"]   # nothing to shut down


def test_failing_device_count_exports_nothing():
    registry = CollectorRegistry()
    GpuCollector(registry, nvml=FakeNvml(count_error=pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)))
    assert scrape(registry) == {}


def test_real_nvml_on_this_machine_is_consistent_with_its_status():
    registry = CollectorRegistry()
    collector = GpuCollector(registry)       # the real pynvml module
    names = {name for name, _ in scrape(registry)}
    if collector.status is NvmlStatus.UNAVAILABLE:   # CPU-only build machines
        assert names == set()
    else:
        assert collector.status is NvmlStatus.READY
        assert "llm_gpu_memory_total_bytes" in names
        assert names <= {name for name, _ in GPU_METRICS}
    collector.close()


def test_registry_none_registers_nowhere():
    collector = GpuCollector(nvml=FakeNvml())
    assert [f.name for f in collector.collect()] == [
        "llm_gpu_utilization_ratio", "llm_gpu_memory_controller_utilization_ratio",
        "llm_gpu_memory_used_bytes", "llm_gpu_memory_total_bytes", "llm_gpu_power_watts",
        "llm_gpu_temperature_celsius"]
