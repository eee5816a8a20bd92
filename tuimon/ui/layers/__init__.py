"""The layer panel: per-layer samples as a heatmap of layers × time, the worst layers, one layer's history."""
