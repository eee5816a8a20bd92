"""Screens pushed over the dashboard: help, event details."""
