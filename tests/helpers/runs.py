"""Synthetic runs: one sender's messages with consecutive ``seq`` and a clock, as a viewer gets them."""

from __future__ import annotations

from typing import Any

from publisher.wire.protocol import decode, encode, make_message, wire_numbers

T0 = 1_700_000_000.0
HOST = "testhost"


class RunBuilder:
    """Builds one sender's messages with consecutive ``seq`` numbers and a clock in ``step_s`` steps."""

    def __init__(self, run: str = "synthetic", rank: int = 0, *, t0: float = T0) -> None:
        self.run = run
        self.rank = rank
        self.seq = 0
        self.ts = t0

    def message(self, msg_type: str, step: int | None = None, **body: Any) -> dict[str, Any]:
        message = make_message(
            msg_type, run=self.run, rank=self.rank, host=HOST, ts=self.ts, seq=self.seq, step=step, **body
        )
        self.seq += 1
        return message

    def run_start(self) -> dict[str, Any]:
        return self.message(
            "run_start",
            config={"lr": 0.01, "batch_size": 32},
            seed=1,
            argv=["train.py"],
            cwd="/tmp",
            pid=1,
            world_size=1,
            versions={"python": "3.11"},
            gpu_source="simulated",
        )

    def metrics(self, step: int, **values: float) -> dict[str, Any]:
        return self.message("metrics", step=step, metrics=wire_numbers(values))

    def gpu(
        self, step: int, utils: list[float], *, throttle: dict[int, list[str]] | None = None
    ) -> dict[str, Any]:
        devices = [
            {
                "index": index,
                "name": "Simulated GPU",
                "util": util,
                "mem_used": 40 * 1024**3,
                "mem_total": 80 * 1024**3,
                "temp_c": 60,
                "power_w": 300.0,
                "power_limit_w": 400.0,
                "sm_clock_mhz": 1800,
                "throttle": (throttle or {}).get(index, []),
                "ecc_errors": 0,
            }
            for index, util in enumerate(utils)
        ]
        return self.message("gpu", step=step, simulated=True, devices=devices)

    def event(
        self, step: int, event_id: str, kind: str, severity: str, message: str, count: int = 1, **details: Any
    ) -> dict[str, Any]:
        return self.message(
            "event",
            step=step,
            id=event_id,
            severity=severity,
            kind=kind,
            message=message,
            details=details,
            count=count,
        )

    def invariant(self, name: str, status: str, step: int | None, message: str) -> dict[str, Any]:
        return self.message("invariant", step=step, name=name, status=status, message=message, details={})

    def heartbeat(self, step: int, snapshot: str = "tcp://127.0.0.1:1", dropped: int = 0) -> dict[str, Any]:
        stats = {"sent": self.seq, "dropped": dropped, "queued": 0, "recorded": self.seq}
        return self.message("heartbeat", step=step, snapshot=snapshot, stats=stats)


def synthetic_run(
    run: str = "synthetic", steps: int = 300, *, step_s: float = 0.1, t0: float = T0, end: bool = True
) -> list[dict[str, Any]]:
    """A small, complete run: 4 simulated GPUs (GPU 2 starving from step 100), a loss spike at step
    120 whose episode is updated at 130 (same id, count 2), a NaN loss at 200, invariants (one
    violated at 150), heartbeats, and ``run_end`` when ``end``."""
    builder = RunBuilder(run, t0=t0)
    messages = [builder.run_start()]
    for step in range(steps):
        builder.ts = t0 + step * step_s
        loss = float("nan") if step == 200 else (50.0 if step == 120 else 2.0 / (1 + step / 50))
        messages.append(
            builder.metrics(step, loss=loss, lr=0.01, grad_norm=1.0 + step % 3, samples_per_s=1000.0 + step)
        )
        if step % 10 == 0:
            utils = [95.0, 94.0, 10.0 if step >= 100 else 93.0, 96.0]
            messages.append(builder.gpu(step, utils, throttle={1: ["hw_thermal"]} if step >= 250 else None))
            messages.append(builder.heartbeat(step))
        if step == 50:
            messages.append(builder.invariant("optimizer_changes_params", "ok", 50, "parameters changed"))
            messages.append(
                builder.invariant("grads_cleared", "unchecked", None, "waiting for a second step")
            )
        if step == 120:
            messages.append(
                builder.event(
                    120,
                    "0-1",
                    "loss_spike",
                    "warning",
                    "loss 50 at step 120 is 25x its mean",
                    value=50.0,
                    baseline=2.0,
                    likely_causes=["a corrupted batch"],
                )
            )
        if step == 130:
            messages.append(
                builder.event(
                    120,
                    "0-1",
                    "loss_spike",
                    "warning",
                    "loss spiking again at 130",
                    count=2,
                    value=48.0,
                    baseline=2.0,
                    likely_causes=["a corrupted batch"],
                )
            )
        if step == 150:
            messages.append(builder.invariant("grads_cleared", "violated", 150, "gradients not cleared"))
        if step == 200:
            messages.append(
                builder.event(
                    200,
                    "0-2",
                    "nonfinite_loss",
                    "critical",
                    "loss is nan at step 200",
                    value="nan",
                    likely_causes=["learning rate too high"],
                )
            )
    if end:
        builder.ts = t0 + steps * step_s
        messages.append(builder.message("run_end", step=steps - 1, status="completed"))
    return messages


def decoded(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a viewer gets it: encoded for the wire and decoded (validated) again."""
    return decode(encode(message))
