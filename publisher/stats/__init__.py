"""Per-layer statistics (gradient and weight norms, update ratios, activation statistics) and the
small torch helpers that the statistics, the detectors and the invariant checks share.
"""
