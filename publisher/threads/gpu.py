"""GPU telemetry behind one interface: real NVML readings or a clearly-labelled simulation.

A :class:`GpuSource` returns one dict per device with exactly the protocol's device fields
(:data:`DEVICE_FIELDS`, see ``docs/protocol.md``). :class:`NvmlSource` reads the NVIDIA driver
through nvidia-ml-py; :class:`SimulatedSource` makes plausible numbers for demos and tests on
machines without a GPU, and is impossible to mistake for real data (its names say "Simulated
GPU" and the Monitor marks its messages ``"simulated": true``). :class:`GpuSampler` polls a
source on its own daemon thread so that NVML latency never touches the training loop.

NVML sees every GPU of the node, whatever ``CUDA_VISIBLE_DEVICES`` says, and numbers them in
NVML order (which can differ from CUDA's): the viewer shows the node, not one rank's device.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from publisher.threads.daemon import daemon_thread

log = logging.getLogger(__name__)

#: The fields of one device in a ``gpu`` message, in protocol order.
DEVICE_FIELDS = (
    "index",
    "name",
    "uuid",
    "util",
    "mem_used",
    "mem_total",
    "temp_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "throttle",
    "ecc_errors",
)

#: NVML clock-event ("throttle") reason bits and the names tuimon uses for them. ``gpu_idle``
#: (0x1) and ``applications_clocks`` (0x2) are left out on purpose: an idle GPU or clocks set by
#: the administrator are not throttling. Values from nvml.h (nvmlClocksEventReason*).
THROTTLE_REASON_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
THROTTLE_REASONS = tuple(THROTTLE_REASON_BITS.values())

SOURCE_KINDS = ("auto", "nvml", "simulated", "none")


class GpuUnavailable(RuntimeError):
    """No NVIDIA driver/GPU could be read (no libnvidia-ml, driver not loaded, no device)."""


def no_driver_message(reason: str) -> str:
    """The one line a user sees when GPU telemetry is off because NVML cannot be used."""
    return (
        f"tuimon: no NVIDIA driver found (NVML: {reason}); no GPU readings. Simulated GPUs for a "
        'demo: Monitor(gpu="simulated"), or `tuimon run --gpu simulated`.'
    )


def decode_throttle(mask: int) -> list[str]:
    """Names of the throttle reasons set in an NVML clock-event bitmask (idle is not throttling)."""
    return [name for bit, name in THROTTLE_REASON_BITS.items() if mask & bit]


class GpuSource(abc.ABC):
    """One way to read the node's GPUs. ``read`` is called from the sampler thread only."""

    #: ``"nvml"`` or ``"simulated"``; goes into ``run_start.gpu_source``.
    kind: str

    @property
    def simulated(self) -> bool:
        """True when the numbers do not come from hardware (``gpu`` messages say so)."""
        return self.kind != "nvml"

    @abc.abstractmethod
    def read(self) -> list[dict[str, Any]]:
        """One dict per device with exactly :data:`DEVICE_FIELDS` (unreadable fields are None)."""

    def close(self) -> None:  # noqa: B027  (most sources hold nothing to release)
        """Release the source; reading after ``close`` is not allowed."""


class NvmlSource(GpuSource):
    """Real readings from the NVIDIA driver through nvidia-ml-py (``pynvml``).

    Each field is read in its own ``try``: a field the device does not support (power on some
    boards, ECC on consumer cards) is None instead of losing the whole device. Raises
    :class:`GpuUnavailable` on construction when there is no driver or no GPU.
    """

    kind = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # a dependency of tuimon, but an install can be partial
            raise GpuUnavailable(no_driver_message(f"nvidia-ml-py not importable: {exc}")) from None
        self._nvml = pynvml
        self._logged_errors: set[tuple[int, str]] = set()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(no_driver_message(str(exc))) from None
        self._closed = False
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.close()
            raise GpuUnavailable(no_driver_message(str(exc))) from None
        if not self._handles:
            self.close()
            raise GpuUnavailable(no_driver_message("the driver reports no GPU"))
        # Names and UUIDs never change: read them once.
        self._names = [self._field(pynvml.nvmlDeviceGetName, h) for h in self._handles]
        self._uuids = [self._field(pynvml.nvmlDeviceGetUUID, h) for h in self._handles]
        # Drivers before r535 lack the "ClocksEvent" name of the same call: fall back to the old one.
        self._throttle_fn = pynvml.nvmlDeviceGetCurrentClocksEventReasons
        try:
            self._throttle_fn(self._handles[0])
        except pynvml.NVMLError_FunctionNotFound:
            self._throttle_fn = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        except pynvml.NVMLError:
            pass  # a problem of this device, not of the call: read() reports it per field

    def _field(self, fn: Callable[..., Any], *args: Any, index: int | None = None) -> Any:
        """``fn(*args)``, or None if NVML cannot give it (unsupported: silent; other: logged once)."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if not isinstance(exc, self._nvml.NVMLError_NotSupported):
                key = (-1 if index is None else index, type(exc).__name__)
                if key not in self._logged_errors:
                    self._logged_errors.add(key)
                    log.warning("tuimon: NVML %s failed on GPU %s: %s", fn.__name__, index, exc)
            return None

    def read(self) -> list[dict[str, Any]]:
        nvml = self._nvml
        devices = []
        for index, handle in enumerate(self._handles):
            memory = self._field(nvml.nvmlDeviceGetMemoryInfo, handle, index=index)
            util = self._field(nvml.nvmlDeviceGetUtilizationRates, handle, index=index)
            power_mw = self._field(nvml.nvmlDeviceGetPowerUsage, handle, index=index)
            limit_mw = self._field(nvml.nvmlDeviceGetEnforcedPowerLimit, handle, index=index)
            reasons = self._field(self._throttle_fn, handle, index=index)
            devices.append(
                {
                    "index": index,
                    "name": self._names[index],
                    "uuid": self._uuids[index],
                    "util": None if util is None else float(util.gpu),
                    "mem_used": None if memory is None else int(memory.used),
                    "mem_total": None if memory is None else int(memory.total),
                    "temp_c": self._field(
                        nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU, index=index
                    ),
                    "power_w": None if power_mw is None else power_mw / 1000.0,
                    "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
                    "sm_clock_mhz": self._field(
                        nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM, index=index
                    ),
                    "throttle": None if reasons is None else decode_throttle(reasons),
                    "ecc_errors": self._field(
                        nvml.nvmlDeviceGetTotalEccErrors,
                        handle,
                        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        nvml.NVML_VOLATILE_ECC,
                        index=index,
                    ),
                }
            )
        return devices

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()


class SimulatedSource(GpuSource):
    """Plausible, time-varying readings of ``n_devices`` H100-like 80 GB cards. NOT real data.

    The numbers follow a load in [0, 1] (``set_load`` or a function given to ``follow``, which the
    Monitor wires to "a training step happened recently"), plus scenario switches the demo and the
    tests use: :meth:`starve`, :meth:`throttle`, :meth:`add_ecc_errors`. Temperatures and power
    move towards their targets with first-order lags in wall time, as real cards do.
    """

    kind = "simulated"

    MEM_TOTAL = 81_559 * 1024 * 1024  # an H100 80GB HBM3 reports 81559 MiB
    POWER_LIMIT_W = 700.0
    MAX_SM_MHZ = 1980
    IDLE_SM_MHZ = 345
    TEMP_TAU_S = 8.0
    POWER_TAU_S = 1.5

    def __init__(self, n_devices: int = 4, seed: int = 0) -> None:
        if n_devices < 1:
            raise ValueError("a simulated node needs at least one GPU")
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._load: float = 1.0
        self._load_fn: Callable[[], float] | None = None
        self._starved: set[int] = set()
        self._throttled: dict[int, str] = {}
        self._ecc = [0] * n_devices
        self._phase = [self._rng.uniform(0, 2 * math.pi) for _ in range(n_devices)]
        self._mem_base = [self._rng.uniform(0.74, 0.80) * self.MEM_TOTAL for _ in range(n_devices)]
        self._temp: list[float] = []  # lagged per-device state, set by the first read
        self._power: list[float] = []
        self._memory_held = False  # a training process keeps its GPU memory once allocated
        self._last_read: float | None = None
        self._start = time.monotonic()
        self.n_devices = n_devices
        self._seed = seed

    # -- scenario controls (any thread) ---------------------------------------------------------

    def set_load(self, load: float) -> None:
        """Fix the node's load (0 idle .. 1 fully busy); ends any ``follow``."""
        with self._lock:
            self._load = min(1.0, max(0.0, float(load)))
            self._load_fn = None

    def follow(self, load_fn: Callable[[], float]) -> None:
        """Take the load from ``load_fn()`` at every read (the Monitor: 1 while steps happen)."""
        with self._lock:
            self._load_fn = load_fn

    def starve(self, index: int, on: bool = True) -> None:
        """GPU ``index`` waits for work (a slow input pipeline on its rank): 15-25 % busy."""
        self._check(index)
        with self._lock:
            (self._starved.add if on else self._starved.discard)(index)

    def throttle(self, index: int, reason: str | None) -> None:
        """GPU ``index`` throttles for ``reason`` (one of :data:`THROTTLE_REASONS`); None clears."""
        self._check(index)
        if reason is not None and reason not in THROTTLE_REASONS:
            raise ValueError(f"unknown throttle reason {reason!r}; known: {', '.join(THROTTLE_REASONS)}")
        with self._lock:
            if reason is None:
                self._throttled.pop(index, None)
            else:
                self._throttled[index] = reason

    def add_ecc_errors(self, index: int, count: int = 1) -> None:
        """GPU ``index`` reports ``count`` more volatile uncorrected ECC errors."""
        self._check(index)
        with self._lock:
            self._ecc[index] += count

    def _check(self, index: int) -> None:
        if not 0 <= index < self.n_devices:
            raise IndexError(f"simulated GPU {index} does not exist (0..{self.n_devices - 1})")

    # -- reading (sampler thread) ---------------------------------------------------------------

    def read(self) -> list[dict[str, Any]]:
        with self._lock:
            load = self._load
            if self._load_fn is not None:
                try:
                    load = min(1.0, max(0.0, float(self._load_fn())))
                except Exception:  # a broken load function must not stop the readings
                    log.exception("tuimon: simulated GPU load function failed")
            now = time.monotonic()
            dt = 0.0 if self._last_read is None else min(5.0, now - self._last_read)
            self._last_read = now
            return [self._device(i, load, now, dt) for i in range(self.n_devices)]

    def _device(self, index: int, load: float, now: float, dt: float) -> dict[str, Any]:
        rng = self._rng
        wave = math.sin((now - self._start) / 7.0 + self._phase[index])
        reason = self._throttled.get(index)
        thermal = reason in ("sw_thermal", "hw_thermal", "hw_slowdown")
        if index in self._starved and load > 0:
            util = rng.uniform(15.0, 25.0)
        else:
            util = max(0.0, min(100.0, load * (95.0 + 2.5 * wave) + rng.gauss(0.0, 1.5)))
        busy = util / 100.0
        power_target = 70.0 + busy * (560.0 + 60.0 * wave)
        temp_target = 33.0 + busy * 36.0 + 2.0 * wave
        clock = self.IDLE_SM_MHZ + (busy * (self.MAX_SM_MHZ - self.IDLE_SM_MHZ) if busy > 0.05 else 0.0)
        if thermal:
            temp_target, power_target, clock = 89.0, power_target * 0.75, clock * 0.62
        elif reason in ("sw_power_cap", "hw_power_brake"):
            power_target = self.POWER_LIMIT_W if reason == "sw_power_cap" else 0.5 * self.POWER_LIMIT_W
            clock *= 0.8 if reason == "sw_power_cap" else 0.45
        temp = _lag(self._temp, index, temp_target, dt, self.TEMP_TAU_S)
        if thermal and temp < 86.0:
            temp = self._temp[index] = 86.0  # the throttle comes from heat: never on a cool card
        power = _lag(self._power, index, power_target, dt, self.POWER_TAU_S)
        self._memory_held = self._memory_held or load > 0
        mem_used = 600 * 1024 * 1024 + (self._mem_base[index] if self._memory_held else 0.0)
        return {
            "index": index,
            "name": "Simulated GPU (H100-like 80GB)",
            "uuid": f"GPU-SIMULATED-{self._seed:04d}-{index:04d}",
            "util": round(util, 1),
            "mem_used": int(mem_used + rng.uniform(0, 64) * 1024 * 1024),
            "mem_total": self.MEM_TOTAL,
            "temp_c": round(temp + rng.gauss(0.0, 0.3)),
            "power_w": round(min(self.POWER_LIMIT_W, power + rng.gauss(0.0, 4.0)), 1),
            "power_limit_w": self.POWER_LIMIT_W,
            "sm_clock_mhz": int(round(clock / 15.0) * 15),
            "throttle": [reason] if reason else [],
            "ecc_errors": self._ecc[index],
        }


def _lag(values: list[float], index: int, target: float, dt: float, tau: float) -> float:
    """First-order lag of ``values[index]`` towards ``target`` over ``dt`` s (starts at the target)."""
    if index == len(values):
        values.append(target)
    values[index] += (target - values[index]) * (1.0 - math.exp(-dt / tau))
    return values[index]


def open_gpu_source(kind: str = "auto") -> GpuSource | None:
    """The GPU source a run asked for: ``auto`` (NVML if a driver is there, else None, said once),
    ``nvml`` (raises :class:`GpuUnavailable`), ``simulated`` or ``none``."""
    if kind == "none":
        return None
    if kind == "simulated":
        return SimulatedSource()
    if kind == "nvml":
        return NvmlSource()
    if kind == "auto":
        try:
            return NvmlSource()
        except GpuUnavailable as exc:
            _say_once(str(exc))
            return None
    raise ValueError(f"unknown GPU source {kind!r}; choose one of {', '.join(SOURCE_KINDS)}")


_said: set[str] = set()


def _say_once(line: str) -> None:
    """Log ``line`` as a warning the first time only: a training script may open many monitors."""
    if line not in _said:
        _said.add(line)
        log.warning("%s", line)


class GpuSampler:
    """Reads a source every ``interval_s`` on a daemon thread and hands the devices to ``on_sample``.

    A failing read or callback is logged the first time and counted in ``failures``; the thread
    keeps going (a GPU that errors once, e.g. during a driver hiccup, often answers again).
    """

    def __init__(
        self,
        source: GpuSource,
        on_sample: Callable[[list[dict[str, Any]]], None],
        interval_s: float = 1.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.source = source
        self.interval_s = interval_s
        self.failures = 0
        self.samples = 0
        self._on_sample = on_sample
        self._stopping = threading.Event()
        self._thread = daemon_thread(self._run, "tuimon-gpu-sampler")

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._on_sample(self.source.read())
                self.samples += 1
            except Exception:
                self.failures += 1
                if self.failures == 1:
                    log.exception("tuimon: reading the GPUs failed (logged once; sampling continues)")
            self._stopping.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def stop(self, timeout: float = 2.0) -> None:
        """Stop sampling and wait (bounded) for the thread; idempotent."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
