"""`segserve audit` reads config.properties as TorchServe does: every file of a corpus of tricky ones (and a few
hundred random ones) loaded by Java itself (`java.util.Properties.load(InputStream)`, as TorchServe's ConfigManager
reads it; data/LoadProperties.java, one JVM for the whole corpus) and by segserve/audit/java_properties.py, each key,
value and Boolean.parseBoolean compared. Here, not in tests/unit/: it runs Java.

The PyPI parsers weighed on the same corpus before the port was written: jproperties 2.1.2 read 12 of its 428 files
unlike Java, javaproperties 0.8.2 read 15 (surrogate pairs aside), both among them `\\` alone on a line followed by
`#x=1` (Java: a comment; both: the key `#x`)."""

import random
import shutil
import subprocess
import time

import pytest

from segserve.audit.java_properties import load, parse_boolean
from tests.conftest import ROOT

ORACLE = ROOT / "tests" / "integration" / "data" / "LoadProperties.java"

CORPUS = {
    # the three of issue #64: each turns token authorization off in TorchServe
    "unicode_escape": b"disable_token_authorization=\\u0074rue\n",
    "escaped_key": b"disable\\_token_authorization=true\n",
    "even_backslashes_then_key": b"path=C:\\\\\ndisable_token_authorization=true\n",
    "odd_backslashes_continue": b"a=one\\\n   two\nb=three\\\\\\\n\t four\\\\\\\\\nc=five\n",
    "comment_backslash_does_not_continue": b"# a comment \\\ndisable_token_authorization=true\n! another \\\nx=1\n",
    "continued_into_a_comment_sign": b"a=1\\\n#not a comment\nb=2\\\n  !not either\n",
    "lone_backslash_then_comment": b"\\\n#x=1\n\\\ny=2\n",
    "lone_backslash_at_end": b"a=1\n\\",
    "lone_backslash_newline_at_end": b"a=1\n\\\n",
    "continued_into_blank_line": b"a=x\\\n\n  b=2\n",
    "continued_at_end": b"a=x\\",
    "separators": b"colon:v1\nspace v2\ntab\tv3\nboth = v4\nblank_colon \t : v5\ntwo==v6\nthree:=v7\nff\x0c=\x0cv8\n",
    "empty_values": b"empty=\nalone\ncolon:\nspaces=   \ntrailing=v  \t\n",
    "escapes": b'esc=\\t\\n\\r\\f\\\\\\b\\x\\"\\=\\:\\#\nlead=\\ \\ two spaces\n',
    "escaped_separators_in_keys": b"my\\ key=1\ncolon\\:key=2\neq\\=key=3\nunicode\\u003dsign=4\n",
    "surrogates": b"pair=\\uD83D\\uDE00\nlone=\\uDC00\nupper=\\u00C9\\u00e9\n",
    "cr_only": b"a=1\rdisable_token_authorization=true\rc=3\\\r   cont\r",
    "crlf": b"a=1\r\nb=2\\\r\n   cont\r\n\r\n  # comment\r\nc=3",
    "mixed_line_ends": b"a=1\n\rb=2\r\r\nc=3\\\r\n\nd=4",
    "latin1": b"caf\xe9=na\xefve\nnbsp\xa0key=v\n\xff=\xfe\n",
    "blank_lines_with_whitespace": b"   \n\t\n\x0c\n \t \x0c \na=1\n   \n",
    "comments_after_whitespace": b"   # x=1\n\t! y=2\na=b # not a comment\n",
    "later_key_wins": b"disable_token_authorization=true\ndisable_token_authorization=false\nx=1\nx=2\n",
    "trailing_blank_true": b"disable_token_authorization=true \nenable_model_api=TRUE\n",
    "empty_file": b"",
    "only_comments": b"#\n!\n# \\\n",
    "vertical_tab_is_not_blank": b"\x0bkey=1\nkey2\x0b=2\n",
    "nul_and_controls": b"a\x00b=c\x01d\n",
}

RANDOM_FILES = 400
# the characters that steer Java's reader, and a few that do not
RANDOM_ALPHABET = b"ab=: \t\x0c\\\\\\\r\n#!ut0e\xe9"


def random_corpus() -> dict[str, bytes]:
    rng = random.Random(64)
    return {f"random_{i}": bytes(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randrange(30))) for i in range(RANDOM_FILES)}


def ours(data: bytes):
    """What segserve reads: {key: (value, parseBoolean)}, or "error" where Java refuses the file."""
    try:
        return {e.key: (e.value, parse_boolean(e.value)) for e in load(data)}
    except ValueError:
        return "error"


def javas(files: dict[str, bytes], tmp_path) -> dict[str, object]:
    names = list(files)
    paths = []
    for index, name in enumerate(names):
        paths.append(tmp_path / f"{index}.properties")
        paths[-1].write_bytes(files[name])
    started = time.monotonic()
    out = subprocess.run(["java", str(ORACLE), *map(str, paths)], capture_output=True, text=True, check=True, timeout=120).stdout
    print(f"java: {len(paths)} files in {time.monotonic() - started:.1f} s (one JVM)")
    read: dict[str, object] = {name: {} for name in names}
    for row in out.splitlines():
        index, *fields = row.split("\t")
        if fields == ["error"]:
            read[names[int(index)]] = "error"
        else:
            key, value, boolean = fields
            read[names[int(index)]][units(key)] = (units(value), boolean == "true")
    return read


def units(hex_text: str) -> str:
    """LoadProperties.java's 'x' + four hex digits per UTF-16 unit, back to a str (a lone surrogate stays one)."""
    return "".join(chr(int(hex_text[i : i + 4], 16)) for i in range(1, len(hex_text), 4))


@pytest.fixture(scope="module")
def java_reads(tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("no JDK here (`java` not on PATH): the parser is not compared with java.util.Properties")
    return javas(CORPUS | random_corpus(), tmp_path_factory.mktemp("properties"))


def test_the_issue_files_turn_token_authorization_off_in_java_too(java_reads):
    for name in ("unicode_escape", "escaped_key", "even_backslashes_then_key", "comment_backslash_does_not_continue", "cr_only"):
        assert java_reads[name]["disable_token_authorization"] == ("true", True), name
    assert java_reads["trailing_blank_true"]["disable_token_authorization"] == ("true ", False)  # parseBoolean: no trim


def test_every_key_and_value_agrees_with_java_util_properties(java_reads):
    files = CORPUS | random_corpus()
    differ = {name: (ours(data), java_reads[name]) for name, data in files.items() if ours(data) != java_reads[name]}
    assert not differ, f"{len(differ)} file(s) read unlike Java: {dict(list(differ.items())[:3])}"
    assert sum(reads == "error" for reads in java_reads.values()) > 0  # the random files reach the \u refusal too
