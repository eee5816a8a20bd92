"""Alerts beyond the screen: live events at or above a severity, once an episode, rate limited,
to a command and/or a Slack-compatible webhook, delivered off the receiver's thread with retries.

No Textual here (an import-linter contract): ``tuimon tail`` uses it headless, and the dashboard
adds its terminal notifications (:mod:`tuimon.ui.services.desktop_notify`) as one more target.
"""
