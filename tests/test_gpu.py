"""GPU sources: the simulated node behind the NVML interface, the no-driver path, the sampler thread.

Tests that need the absence of a driver skip themselves where one exists, and the test of the
real NVML reader skips itself where none exists (as on CI): run the suite on a GPU node to
exercise it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import torch

from publisher.detectors.gpu import GpuImbalance
from publisher.monitor import Monitor
from publisher.threads.gpu import (
    DEVICE_FIELDS,
    GpuSampler,
    GpuUnavailable,
    NvmlSource,
    SimulatedSource,
    decode_throttle,
    open_gpu_source,
)
from publisher.wire.protocol import decode


def driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


needs_no_driver = pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is present on this machine")
needs_driver = pytest.mark.skipif(not driver_present(), reason="no NVIDIA driver on this machine")


# -- simulated source ----------------------------------------------------------------------------


def test_simulated_devices_have_exactly_the_protocol_fields_and_say_they_are_simulated() -> None:
    source = SimulatedSource(n_devices=4)
    assert source.kind == "simulated" and source.simulated
    devices = source.read()
    assert [d["index"] for d in devices] == [0, 1, 2, 3]
    for device in devices:
        assert tuple(device) == DEVICE_FIELDS
        assert "Simulated GPU" in device["name"] and "SIMULATED" in device["uuid"]
        assert 0 <= device["util"] <= 100
        assert 0 < device["mem_used"] <= device["mem_total"] == 81_559 * 1024 * 1024
        assert 20 <= device["temp_c"] <= 95 and 0 < device["power_w"] <= device["power_limit_w"]
        assert device["throttle"] == [] and device["ecc_errors"] == 0
    json.dumps(devices, allow_nan=False)  # wire-safe as it is
    assert len({d["uuid"] for d in devices}) == 4


def test_simulated_numbers_vary_and_follow_the_load() -> None:
    source = SimulatedSource(n_devices=2, seed=1)
    busy = [source.read()[0]["util"] for _ in range(20)]
    assert len(set(busy)) > 10 and min(busy) > 85
    source.set_load(0.0)
    assert max(source.read()[0]["util"] for _ in range(5)) < 5
    load = [1.0]
    source.follow(lambda: load[0])
    assert source.read()[1]["util"] > 85
    load[0] = 0.0
    assert source.read()[1]["util"] < 5


def test_starving_one_gpu_makes_the_imbalance_detectable() -> None:
    source = SimulatedSource()
    detector = GpuImbalance()
    healthy = [list(detector.observe_gpu(step, source.read())) for step in range(10)]
    assert healthy == [[]] * 10
    source.starve(2)
    utils = []
    found = []
    for step in range(10, 20):
        devices = source.read()
        utils.append(devices[2]["util"])
        found.extend(detector.observe_gpu(step, devices))
    assert all(15 <= u <= 25 for u in utils)
    assert found and {f.key for f in found} == {2}
    source.starve(2, on=False)
    assert source.read()[2]["util"] > 85


def test_throttle_and_ecc_scenarios() -> None:
    source = SimulatedSource()
    before = source.read()[1]
    source.throttle(1, "hw_thermal")
    hot = source.read()[1]
    assert hot["throttle"] == ["hw_thermal"] and hot["temp_c"] >= 85
    assert hot["sm_clock_mhz"] < before["sm_clock_mhz"]
    source.throttle(1, None)
    assert source.read()[1]["throttle"] == []
    source.add_ecc_errors(3, 2)
    assert [d["ecc_errors"] for d in source.read()] == [0, 0, 0, 2]
    with pytest.raises(ValueError, match="unknown throttle reason"):
        source.throttle(0, "too_hot")
    with pytest.raises(IndexError):
        source.starve(4)


# -- NVML ----------------------------------------------------------------------------------------


def test_throttle_bits_decode_to_names_and_idle_is_not_throttling() -> None:
    mask = (
        pynvml.nvmlClocksEventReasonGpuIdle
        | pynvml.nvmlClocksEventReasonApplicationsClocksSetting
        | pynvml.nvmlClocksEventReasonSwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    assert decode_throttle(mask) == ["sw_thermal", "hw_power_brake"]
    assert decode_throttle(pynvml.nvmlClocksEventReasonGpuIdle) == []
    power_and_board = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown
    assert decode_throttle(power_and_board) == ["sw_power_cap", "hw_slowdown"]
    assert decode_throttle(pynvml.nvmlClocksEventReasonHwThermalSlowdown) == ["hw_thermal"]


@needs_driver
def test_nvml_reads_every_device_of_this_node_with_the_protocol_fields() -> None:
    source = open_gpu_source("nvml")
    try:
        assert source is not None and source.kind == "nvml" and not source.simulated
        devices = source.read()
    finally:
        source.close()
    assert [d["index"] for d in devices] == list(range(pynvml_device_count()))
    for device in devices:
        assert tuple(device) == DEVICE_FIELDS
        assert "Simulated" not in (device["name"] or "")
        assert 0 <= device["util"] <= 100
        assert 0 < device["mem_used"] <= device["mem_total"]
        assert device["temp_c"] > 0 and device["sm_clock_mhz"] > 0
        assert device["throttle"] is None or isinstance(device["throttle"], list)
    json.dumps(devices)  # wire-safe as read


def pynvml_device_count() -> int:
    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


@needs_no_driver
def test_nvml_without_a_driver_raises_a_clear_error() -> None:
    with pytest.raises(GpuUnavailable, match=r"no NVIDIA driver found \(NVML: .+\).*--gpu simulated"):
        NvmlSource()
    with pytest.raises(GpuUnavailable, match="no NVIDIA driver found"):
        open_gpu_source("nvml")


@needs_no_driver
def test_auto_without_a_driver_returns_none_and_says_so_once() -> None:
    script = (
        "from publisher.threads.gpu import open_gpu_source\n"
        "assert open_gpu_source('auto') is None\n"
        "assert open_gpu_source('auto') is None\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tuimon: no NVIDIA driver found (NVML: ")
    assert lines[0].endswith('Monitor(gpu="simulated"), or `tuimon run --gpu simulated`.')


def test_other_source_kinds() -> None:
    assert isinstance(open_gpu_source("simulated"), SimulatedSource)
    assert open_gpu_source("none") is None
    with pytest.raises(ValueError, match="auto, nvml, simulated, none"):
        open_gpu_source("amd")


# -- sampler -------------------------------------------------------------------------------------


class FlakySource(SimulatedSource):
    """A node whose driver fails some reads (as NVML does during a driver hiccup)."""

    def __init__(self, failing_reads: set[int]) -> None:
        super().__init__(n_devices=2)
        self.reads = 0
        self.failing_reads = failing_reads

    def read(self) -> list[dict[str, Any]]:
        self.reads += 1
        if self.reads in self.failing_reads:
            raise RuntimeError(f"driver hiccup on read {self.reads}")
        return super().read()


def test_sampler_survives_failing_reads_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    samples: list[list[dict[str, Any]]] = []
    enough = threading.Event()

    def on_sample(devices: list[dict[str, Any]]) -> None:
        samples.append(devices)
        if len(samples) >= 5:
            enough.set()

    source = FlakySource(failing_reads={1, 3})
    with caplog.at_level(logging.ERROR, logger="publisher.threads.gpu"):
        sampler = GpuSampler(source, on_sample, interval_s=0.01).start()
        assert enough.wait(5.0), "the sampler stopped after a failing read"
        sampler.stop()
    assert sampler.failures == 2
    assert len([r for r in caplog.records if "reading the GPUs failed" in r.getMessage()]) == 1
    reads = source.reads
    time.sleep(0.05)
    assert source.reads == reads, "stop() really stops the thread"


# -- through the Monitor -------------------------------------------------------------------------


def test_monitor_publishes_simulated_gpu_messages_whose_load_follows_training(tmp_path: Path) -> None:
    record = tmp_path / "run.jsonl"
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(model, optimizer, run="gpu-test", gpu="simulated", gpu_interval=0.02, record=record)
    assert isinstance(mon.gpu_source, SimulatedSource)
    time.sleep(0.1)  # samples before the first step: the GPUs are idle
    mon.gpu_source.starve(2)
    started = time.monotonic()
    while time.monotonic() - started < 0.6:
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        mon.step(loss)
        optimizer.zero_grad()
        time.sleep(0.005)
    mon.close()
    messages = [decode(line) for line in record.read_bytes().splitlines()]
    assert messages[0]["type"] == "run_start" and messages[0]["gpu_source"] == "simulated"
    gpu = [m for m in messages if m["type"] == "gpu"]
    assert len(gpu) >= 10 and all(m["simulated"] is True for m in gpu)
    assert all(tuple(d) == DEVICE_FIELDS for m in gpu for d in m["devices"])
    last_step_at = max(m["ts"] for m in messages if m["type"] == "metrics")
    before = [m for m in gpu if m.get("step") is None]  # a sample carries the latest step taken
    during = [m for m in gpu if m.get("step") is not None and m["ts"] < last_step_at]
    assert before and len(during) >= 5, (len(before), len(during))
    assert max(d["util"] for m in before for d in m["devices"]) < 5, "no step yet: the GPUs idle"
    # A sample can fall in a pause of the loop (this machine is shared): most of them are busy.
    busiest = sorted(min(m["devices"][i]["util"] for i in (0, 1, 3)) for m in during)
    assert busiest[len(busiest) // 2] > 85, "training: the GPUs are busy"
    assert all(m["devices"][2]["util"] < 30 for m in during), "GPU 2 waits for data"
    events = [m for m in messages if m["type"] == "event"]
    assert {(e["kind"], e["details"]["index"]) for e in events} == {("gpu_imbalance", 2)}
    assert all(
        e["details"]["simulated"] is True and e["message"].startswith("[simulated GPUs] ") for e in events
    )
