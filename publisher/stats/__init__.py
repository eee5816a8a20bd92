"""Per-layer statistics: gradient and weight norms, update ratios, activation statistics, taken on
sampled steps within their cost budget, and finding the model's roots from the optimizers.
"""
