"""Theme files: loading, errors that name the file, and switching themes in the running app."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from helpers.waiting import wait_for_screen
from textual_plotext import PlotextPlot

from tuimon.errors import UserError
from tuimon.sources.replay import ReplaySource
from tuimon.ui.app import TuimonApp
from tuimon.ui.themes import THEME_ORDER, check_theme_name, load_theme, load_themes, themes_dir


def test_the_shipped_themes_load() -> None:
    themes = load_themes()
    assert set(THEME_ORDER) <= set(themes)
    assert themes["tuimon-light"].dark is False
    contrast = themes["tuimon-contrast"]
    assert (contrast.background, contrast.foreground) == ("#000000", "#FFFFFF")
    # the high-contrast states are not told apart by red against green
    assert contrast.success.upper() != "#00FF00" and contrast.error != contrast.success


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('name = "x"\nprimary = "#12345"\n', "'primary'"),
        ('name = "x"\nprimary = \n', "not valid TOML"),
        ('name = "x"\n', "missing 'primary'"),
        ('name = "x"\nprimary = "#123456"\ncolour = "red"\n', "unknown key 'colour'"),
        ('name = "x"\nprimary = "#123456"\ndark = "yes"\n', "'dark' has the wrong type"),
        ('name = "x"\nprimary = "#123456"\n[variables]\nborder = 3\n', "variable 'border' must be a string"),
    ],
)
def test_a_broken_theme_file_names_the_file_and_the_problem(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(content)
    with pytest.raises(UserError) as error:
        load_theme(path)
    assert str(path) in str(error.value) and problem in str(error.value)


def test_a_broken_theme_in_the_folder_fails_loading(tmp_path: Path) -> None:
    for source in themes_dir().glob("*.toml"):
        (tmp_path / source.name).write_text(source.read_text())
    (tmp_path / "zz.toml").write_text('name = "tuimon-dark"\nprimary = "#000000"\n')
    with pytest.raises(
        UserError, match=re.escape("zz.toml: theme name 'tuimon-dark' is used by another file")
    ):
        load_themes(tmp_path)


def test_unknown_theme_name_lists_the_choices() -> None:
    with pytest.raises(UserError, match="unknown theme 'neon'; choose one of tuimon-contrast"):
        check_theme_name("neon", load_themes())
    assert check_theme_name("textual-dark", load_themes()) == "textual-dark"


async def test_switching_themes_redraws_every_panel(recording: Path) -> None:
    app = TuimonApp(ReplaySource([recording], speed=math.inf), theme="tuimon-contrast")
    async with app.run_test(size=(160, 48)) as pilot:
        assert app.theme == "tuimon-contrast"
        await wait_for_screen(
            pilot, lambda: "last" in app.query_one(PlotextPlot).render().plain, what="the chart"
        )
        backgrounds = set()
        for expected in ("tuimon-dark", "tuimon-light", "tuimon-contrast"):
            await pilot.press("t")
            assert app.theme == expected
            await pilot.pause()
            # the chart re-renders with the new colours (its log scale must survive a re-render)
            assert "loss  last" in app.query_one(PlotextPlot).render().plain
            backgrounds.add(app.screen.styles.background.hex)
            assert "SIMULATED" in app.export_screenshot()
        assert len(backgrounds) == 3
