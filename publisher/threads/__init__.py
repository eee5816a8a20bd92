"""What runs beside the training thread, each on a daemon thread of its own.

- ``step_worker.py``: finishes each step (publishing, the detectors) every 0.1 s, so that the
  training thread only queues it;
- ``watchdog.py``: notices when steps stop and says where the training thread is and whether it
  is stuck, busy or waiting in a collective, reading its Python stack (``stacks.py``) and its CPU
  time and I/O (``thread_usage.py``) from outside;
- ``gpu.py``: polls the GPU source (NVML, or the simulation), so that the driver's latency never
  touches the training loop.

They are kept apart from the readings (``readings/``) because their cost is paid off the
training thread, and because each has a life of its own to start and stop (``wiring.py`` builds
them and says the order of closing). What they hand on goes through callbacks; none of them
publishes or judges anything itself.
"""
