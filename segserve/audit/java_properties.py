"""A .properties file read exactly as `java.util.Properties.load(InputStream)` of JDK 17 reads it (TorchServe's
ConfigManager reads config.properties so): a port of its `LineReader.readLine`, `load0` and `loadConvert`, with the
line each key starts on. tests/integration/test_audit_properties.py holds it against Java itself.

Written here rather than taken from PyPI: on that test's corpus `jproperties` 2.1.2 and `javaproperties` 0.8.2 each
read a dozen files unlike Java (a comment after a line of one backslash read as a key, surrogate escapes refused, the
empty key of a file ending in a backslash dropped), and neither gives the line a key is on, which every finding names."""

import re
from dataclasses import dataclass

WHITESPACE = " \t\f"  # Java's, in a .properties file: not \v, not U+00A0
ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}  # any other escaped character stands for itself
ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|u|.)", re.DOTALL)


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    line: int  # the physical line (1-based; CR, LF and CRLF each end one) its logical line starts on


def load(data: bytes) -> list[Entry]:
    """Every key=value of the file in order (a later key overrides an earlier one, as in Java's Hashtable).
    ValueError for a malformed \\uxxxx escape, where Java throws IllegalArgumentException."""
    return [Entry(*_key_value(text, line), line) for text, line in _logical_lines(data.decode("iso-8859-1"))]


def parse_boolean(value: str) -> bool:
    """Java's Boolean.parseBoolean, which TorchServe reads its switches with: 'true' in any case, no blank around."""
    return value.lower() == "true"


def _logical_lines(text: str):
    """(logical line, its first line number): readLine's states, one character at a time."""
    chars: list[str] = []
    start = number = 1
    skip_white, appended, backslash, skip_lf, comment = True, False, False, False, False
    for index, c in enumerate(text):
        here = number
        number += c == "\r" or (c == "\n" and text[index - 1 : index] != "\r")
        if comment:  # a comment runs to the line's end, whatever backslashes it holds
            comment = c not in "\r\n"
            skip_white = not comment
            continue
        if skip_lf:  # the LF of a CRLF that a continuation ended
            skip_lf = False
            if c == "\n":
                continue
        if skip_white:  # leading blanks, and blank lines unless a continuation just began
            if c in WHITESPACE or (not appended and c in "\r\n"):
                continue
            skip_white = appended = False
        if not chars and c in "#!":
            comment = True
        elif c not in "\r\n":
            start = here if not chars else start
            chars.append(c)
            backslash = c == "\\" and not backslash
        elif not chars:
            skip_white = True
        elif backslash and index + 1 < len(text):  # an odd run of backslashes continues the line, not at the end
            chars.pop()
            skip_white = appended = True
            backslash, skip_lf = False, c == "\r"
        else:
            yield "".join(chars[:-1] if backslash else chars), start
            chars, skip_white, backslash = [], True, False
    if chars:
        yield "".join(chars[:-1] if backslash else chars), start


def _key_value(text: str, line: int) -> tuple[str, str]:
    """load0: the key ends at the first unescaped '=', ':' or blank; blanks and one '=' or ':' go before the value."""
    key_end = value_start = len(text)
    separator = backslash = False
    for index, c in enumerate(text):
        if not backslash and c in "=:" + WHITESPACE:
            key_end, value_start, separator = index, index + 1, c in "=:"
            break
        backslash = c == "\\" and not backslash
    while value_start < len(text) and (text[value_start] in WHITESPACE or (not separator and text[value_start] in "=:")):
        separator = separator or text[value_start] in "=:"
        value_start += 1
    return _unescape(text[:key_end], line), _unescape(text[value_start:], line)


def _unescape(text: str, line: int) -> str:
    """loadConvert: \\uxxxx, \\t \\n \\r \\f, and \\x for any other x."""

    def one(match: re.Match) -> str:
        escaped = match.group(1)
        if escaped == "u":
            raise ValueError(f"line {line}: malformed \\uxxxx escape (Java refuses the whole file)")
        return chr(int(escaped[1:], 16)) if len(escaped) == 5 else ESCAPES.get(escaped, escaped)

    return ESCAPE.sub(one, text)
