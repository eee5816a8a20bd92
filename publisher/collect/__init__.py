"""How a step's numbers are gathered without slowing the step: the step worker thread, host and
device memory, GPU readings (NVML), and what identifies the process and its environment.
"""
