"""Run as `python -c <this file's text> HANDLER` in an extracted archive's folder (handler_check.py): import the
handler as TorchServe 0.12's ts/model_loader.py does, and print one JSON line, {"failure": "<chain>"}
or {"failure": null} (with "names": the module's attributes, for a `file.py:function` handler). It imports nothing
of segserve, so it runs under any Python that has the archive's dependencies."""

import importlib
import json
import os
import site
import sys
import sysconfig
import traceback


def load(handler: str) -> BaseException | None:
    """The exception TorchServe's loader would meet: its own try of the handler file, then, on an ImportError,
    ts.torch_handler.<handler>. When the file exists but fails, the file's error is the cause (TorchServe's
    loader raises the fallback's "No module named 'ts.torch_handler.…'" instead); when there is no such file,
    the fallback's."""
    module_name = handler.split(":", 1)[0].removesuffix(".py").split("/")[-1]
    own = None
    try:
        importlib.import_module(module_name)
        return None
    except ImportError as error:  # outside this block the fallback's error gets no __context__ from it
        own = error
    try:
        importlib.import_module(f".{handler}", "ts.torch_handler")
        return None
    except ImportError as fallback:
        if not (isinstance(own, ModuleNotFoundError) and own.name == module_name):
            return own  # the archive's file is there and failed: its own error is the cause
        if isinstance(fallback, ModuleNotFoundError) and fallback.name == f"ts.torch_handler.{handler}":
            return ModuleNotFoundError(f"no handler {handler}: neither {module_name}.py in the archive nor ts.torch_handler.{handler}")
        return fallback  # a TorchServe handler that fails (a module it needs is missing)


def where(filename: str, roots: list[str]) -> str:
    """A frame's file, short: relative to the archive folder or a site-packages folder (ts/torch_handler/…)."""
    path = os.path.abspath(filename)
    for root in roots:
        if path.startswith(root + os.sep):
            return path[len(root) + 1 :]
    return path


def chain(error: BaseException) -> str:
    """Innermost cause first: each exception as `Type: message`, then the files it passed through, innermost
    first (the import machinery's frames, frozen or in the standard library, left out)."""
    roots = [os.getcwd(), *{sysconfig.get_paths()["purelib"], *site.getsitepackages()}]
    stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
    errors = []
    while error is not None and error not in errors:
        errors.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    parts = []
    for error in reversed(errors):
        kind = type(error).__qualname__
        if type(error).__module__ != "builtins":
            kind = f"{type(error).__module__}.{kind}"
        message = " ".join(str(error).split())
        parts.append(f"{kind}: {message}" if message else kind)
        frames = traceback.extract_tb(error.__traceback__)
        frames = [f for f in frames if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(stdlib)]
        parts += [f"{where(f.filename, roots)}:{f.lineno}" for f in reversed(frames)]
    return " ← ".join(parts)


def names(handler: str) -> list[str] | None:
    """For a `file.py:function` handler whose file imported: every attribute of its module, where the loader looks a
    function node's name up (hasattr), whatever bound it (a def, `pre, post = make()`, globals())."""
    module = sys.modules.get(handler.split(":", 1)[0].removesuffix(".py").split("/")[-1])
    return sorted(n for n in dir(module) if isinstance(n, str)) if ":" in handler and module is not None else None


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # what a handler prints while it imports must not mix with the answer
    try:
        error = load(sys.argv[1])
    except BaseException as raised:  # a SyntaxError, or anything a handler's module code raises
        error = raised
    answer = {"failure": None if error is None else chain(error), "names": names(sys.argv[1]) if error is None else None}
    out.write(json.dumps(answer) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
