"""Walking markdown-it-py's token stream: the parser settings and the few helpers every reader needs.

Runbooks and exported incidents are both read from the flat token list markdown-it produces
(open/close tokens with a nesting level and a source line map), so finding where a block ends,
which line a problem is on and what text a list holds is written once, here.
"""

from __future__ import annotations

from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.token import Token


def markdown_parser() -> MarkdownIt:
    """CommonMark plus tables: what runbooks and exports are written in (and what GitHub shows)."""
    return MarkdownIt("commonmark").enable("table")


def inline_texts(tokens: Sequence[Token], start: int, end: int) -> list[str]:
    """The text of every inline token in ``tokens[start:end]`` (paragraphs, headings, list items)."""
    return [token.content for token in tokens[start:end] if token.type == "inline"]


def line_of(token: Token) -> int:
    """The 1-based source line a block token starts on (problems name it)."""
    return (token.map or [0])[0] + 1


def block_end(tokens: Sequence[Token], start: int) -> int:
    """Index just past the block that opens at ``start`` (its matching close token)."""
    if tokens[start].nesting != 1:
        return start + 1
    depth = 0
    for index in range(start, len(tokens)):
        depth += tokens[index].nesting
        if depth == 0:
            return index + 1
    return len(tokens)


def list_items(tokens: Sequence[Token], start: int, end: int) -> list[tuple[int, str]]:
    """(line, text) of each top-level item of the list spanning tokens[start:end]."""
    items = []
    index = start + 1
    while index < end - 1:
        item_end = block_end(tokens, index)
        text = "\n".join(inline_texts(tokens, index, item_end)).strip()
        items.append((line_of(tokens[index]), text))
        index = item_end
    return items
