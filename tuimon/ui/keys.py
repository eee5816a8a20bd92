"""The keys that mean the same on every screen: quit, help, the next theme.

The app binds them, so they work on every screen that does not take the key for a meaning of its
own (the help and the event details close on q). A screen may list them among its own keys to
choose where its footer shows them: the dashboard's lists quit and help first, where a footer cut
at 80 columns still shows them. Their actions name the app, so they do the same from any screen.
"""

from __future__ import annotations

from textual.binding import Binding, BindingType

QUIT = Binding("q", "app.quit", "Quit")
HELP = Binding("question_mark", "app.help", "Help", key_display="?", tooltip="This list of keys")
THEME = Binding("t", "app.next_theme", "Theme", tooltip="Next theme: dark, light, high contrast")
#: The app's bindings, in the order the footer of a screen that does not list them shows them.
APP_KEYS: list[BindingType] = [QUIT, HELP, THEME]
