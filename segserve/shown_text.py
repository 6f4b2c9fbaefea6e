"""Text from outside segserve (an answer's body, a worker's exception, a log line, a file name) as we show it: on a
terminal, and in Markdown (report.md's tables and lists). Raw, its control characters would recolour the terminal or
move its cursor (ANSI escapes), fake a line of ours (CR, LF, U+2028) or reorder what is shown (bidi overrides); its
Markdown and HTML would become links, images or markup in a report, or break a table."""

import re
import unicodedata

# line and paragraph breaks (str.splitlines' and tabs): one space, so that a text stays on the line it was given
BREAKS = re.compile(r"[\t\n\v\f\r\x1c-\x1e\x85\u2028\u2029]+")
# control, format (bidi overrides, zero-width), lone surrogate and separator characters: shown as their escapes
UNSEEN = ("Cc", "Cf", "Cs", "Zl", "Zp")
# Markdown's own characters where they may mean something (an underscore only at a word's edge: `seg_jpeg` stays)
MARKDOWN = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def for_terminal(text: object) -> str:
    """`text` on one line as a terminal may show it: breaks as a space, every other control or format character
    written as its escape (ESC as `\\x1b`, U+202E as `\\u202e`)."""
    return "".join(_escape(char) if unicodedata.category(char) in UNSEEN else char for char in BREAKS.sub(" ", str(text)))


def for_markdown(text: object) -> str:
    """`text` as one Markdown table cell or list item shows it, literally: for_terminal's, then Markdown's
    characters escaped with a backslash and HTML's as entities (no link, image, tag or new cell of its making)."""
    escaped = MARKDOWN.sub(lambda found: "\\" + found.group(0), for_terminal(text))
    return re.sub("[&<>]", lambda found: HTML[found.group(0)], escaped)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
