"""What runs beside the training thread (the step worker, the hang watchdog, GPU sampling) and the
watched torch calls.
"""
