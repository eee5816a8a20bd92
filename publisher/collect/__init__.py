"""How a step's numbers are gathered without slowing the step: the step worker thread, the cost
budgets that space out costly measurements, the one asynchronous device-to-host copy, host and
device memory, GPU readings (NVML), and what identifies the process and its environment.
"""
