"""TorchServe's own worker Context, built in process: to run the handlers outside TorchServe
(the benchmark's jpeg inputs, the GPU check, the tests)."""

from pathlib import Path

from ts.context import Context, RequestProcessor


def worker_context(model_dir: Path | str | None, handler_settings: dict, serialized_file: str | None = None, rows: int = 0, gpu_id=None):
    """A Context as a worker builds it for one model, with `rows` request slots (each row's status and headers)."""
    manifest = {"model": {"modelName": "local", "serializedFile": serialized_file, "handler": "x:handle"}}
    context = Context("local", str(model_dir), manifest, max(rows, 1), gpu_id, "0.12.0", model_yaml_config={"handler": handler_settings})
    context.request_processor = [RequestProcessor({}) for _ in range(rows)]
    return context
