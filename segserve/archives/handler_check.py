"""Why an archive's handler does not load: its import, done as TorchServe's worker does it, in a separate process.

TorchServe 0.12's loader (ts/model_loader.py) imports a handler file of the archive and, on any ImportError,
tries ts.torch_handler.<handler> instead, so its log shows only the fallback's "No module named
'ts.torch_handler.<name>'" and the file's real error (a module the environment lacks) is lost. Importing it
again here, the way the worker does, gives that error back with the files it came through.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("handler_probe.py")  # run with -c: its own folder must not land on sys.path


def handler_import_failure(model_dir: Path, handler: str, python: str = sys.executable, timeout_s: float = 60) -> str | None:
    """The exception chain, one line, innermost cause first ("ModuleNotFoundError: No module named 'captum' ←
    ts/torch_handler/vision_handler.py:8 ← … ← dog_breed_handler.py:3"), of importing `handler` (the manifest's
    handler string: "my_handler.py", "image_classifier", "file.py:fn") from the extracted archive `model_dir`
    with `python`; None when it imports. The worker's environment as TorchServe's frontend makes it
    (EnvironmentUtils.getEnvString): the archive folder as the working directory and on PYTHONPATH, after a
    "dir/file.py:fn" handler's dir and the PYTHONPATH TorchServe itself was given."""
    model_dir = Path(model_dir).resolve()
    paths = [handler.split(":")[0].rpartition("/")[0]] if ":" in handler and "/" in handler.split(":")[0] else []
    paths += [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(model_dir)])}
    try:
        done = subprocess.run(
            [python, "-c", PROBE.read_text(), handler],
            cwd=model_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"importing handler {handler} did not finish in {timeout_s:g} s"
    except OSError as error:
        return f"cannot run {python} to import handler {handler}: {error}"
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])["failure"]
    except (IndexError, ValueError, KeyError, TypeError):
        said = (done.stderr.strip().splitlines() or ["nothing"])[-1]
        return f"importing handler {handler} ended with exit code {done.returncode}: {said}"
