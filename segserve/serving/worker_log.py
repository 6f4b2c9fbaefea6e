"""The first Python exception TorchServe's workers logged, with its chain, as one line innermost cause first.

A worker writes a traceback one line per log entry into logs/model_log.log (`<time> [INFO ] W-<port>-<model>_<version>
-stdout MODEL_LOG - <text>`), entries of several workers interleaved. Python prints a chain cause first, each part
joined to the next by "During handling of the above exception, another exception occurred:" or "The above exception
was the direct cause of the following exception:". The last line of the log is the outermost wrapper (TorchServe's
loader's "No module named 'ts.torch_handler.<name>'", a handler's "Prediction failed"); the first is the cause.
"""

import re

ENTRY = re.compile(r" (W-\d+-\S+?)-std(?:out|err) MODEL_LOG - (.*)$")  # the worker's thread, and what it wrote
FRAME = re.compile(r'^  File "([^"]+)", line (\d+)')
EXCEPTION = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning)?)(?:: (.*))?$")
LINKS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
MODEL_DIR = re.compile(r"/models/[0-9a-f]{32}/")  # where TorchServe extracts an archive
STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
CAUSE_MAX_CHARS = 1000


def first_exception(log_text: str) -> str | None:
    """The first traceback in `log_text` (model_log.log's lines), with the exceptions chained to it, as
    "ValueError: bad ← handler.py:3 ← RuntimeError: gave up ← handler.py:9 ← ts/service.py:135"; None when no
    worker logged a traceback."""
    worker, lines = None, []
    for entry in log_text.splitlines():
        found = ENTRY.search(entry)
        if not found:
            continue
        thread, text = found.groups()
        if worker is None and text == "Traceback (most recent call last):":
            worker = thread
        if thread == worker:
            lines.append(text)
    return _chain(lines) if lines else None


def _chain(lines: list[str]) -> str:
    """One worker's lines from its first "Traceback" on: each exception then its frames innermost first, up to
    the exception no link follows."""
    parts, frames = [], []
    index = 0
    while index < len(lines):
        text = lines[index]
        index += 1
        if frame := FRAME.match(text):
            frames.append(_short(frame.group(1), frame.group(2)))
        elif text.startswith((" ", "Traceback ")) or not text:
            continue
        elif found := EXCEPTION.match(text):
            kind, message = found.groups()
            parts += [f"{kind}: {message}" if message else kind, *_innermost_first(frames)]
            frames = []
            # a link before the next traceback chains the next part to this one (a message may run over lines)
            link = next((line for line in lines[index:] if line in LINKS or line.startswith("Traceback ")), None)
            if link not in LINKS:
                break
            index = lines.index(link, index) + 1
    return " ← ".join(parts)[:CAUSE_MAX_CHARS]


def _innermost_first(frames: list[tuple[str, bool]]) -> list[str]:
    """The frames innermost first; of a library file's consecutive frames (TorchServe's worker loop) only the
    innermost is kept, every frame of the archive's own files."""
    kept: list[str] = []
    library_file = None
    for frame, in_library in reversed([f for f in frames if f[0]]):
        file = frame.rsplit(":", 1)[0] if in_library else None
        if file is None or file != library_file:
            kept.append(frame)
        library_file = file
    return kept


def _short(path: str, line: str) -> tuple[str, bool]:
    """A frame as ("file:line", whether it is a library's): relative to the extracted archive or to
    site-packages; "" for the import machinery (frozen modules, the standard library)."""
    if path.startswith("<") or STDLIB.search(path):
        return "", True
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return f"{path.split(marker, 1)[1]}:{line}", True
    if found := MODEL_DIR.search(path):
        path = path[found.end() :]
    return f"{path}:{line}", False
