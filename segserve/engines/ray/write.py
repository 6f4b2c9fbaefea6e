"""A private file written whole: the key file and Ray's token (mode 0600 from the start, never readable by others
for a moment, and replaced at once for its readers)."""

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, mode 0600, by a rename: a reader sees the old file or the new one, never half of it."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    os.replace(partial, path)
