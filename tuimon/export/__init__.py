"""What tuimon hands to other tools: the latest figures as Prometheus metrics."""
