"""The fuzzer's child process: the handlers behind a pipe (`python -m segserve.qa.fuzz_worker MODEL_DIR seg,jpeg`).

Built as TorchServe builds them, from model_config/*.yaml (the real limits), in a model dir made by
make_model_dir (tiny untrained weights). Requests come in on stdin and replies go out on the original
stdout, each a length-prefixed pickle; segserve/qa/fuzz.py is the only client. A crash takes down this
process only, and faulthandler leaves the Python stack on stderr for the parent's report. What TorchServe does
after handle() is done here too, as far as it can kill a worker: the answer encoded by TorchServe's own
create_predict_response, and every status phrase and header checked as netty checks them (unsafe_answer).
"""

import os
import pickle
import shutil
import signal
import struct
import sys
import time
from pathlib import Path

from segserve import ROOT

CONFIGS = {"seg": "seg.yaml", "jpeg": "jpeg.yaml", "areas": "areas.yaml", "fused": "seg_jpeg_fused.yaml"}


def handler_settings(config: str) -> dict:
    import yaml

    return dict(yaml.safe_load((ROOT / "model_config" / config).read_text())["handler"])


def make_model_dir(folder: Path) -> Path:
    """What the archives hold: tiny weights as seg.pt, the seg_jpeg spec and its nodes' configs."""
    import torch

    from handlers.segnet import SegNet

    torch.manual_seed(0)
    torch.save(SegNet(2).state_dict(), folder / "seg.pt")
    shutil.copy(ROOT / "workflows" / "seg_jpeg.yaml", folder / "seg_jpeg.yaml")
    (folder / "nodes").mkdir()
    for node in ("seg", "jpeg"):
        shutil.copy(ROOT / "model_config" / f"{node}.yaml", folder / "nodes" / f"{node}.yaml")
    return folder


class SelfTest:
    """A handler that misbehaves on request (crash, hang, raise, 500): proves the harness notices each."""

    def handle(self, data: list, context) -> list:
        for idx, row in enumerate(data):
            body = bytes(row["body"])
            if body == b"crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            if body == b"hang":
                time.sleep(3600)
            if body == b"raise":
                raise RuntimeError("deliberate")
            if body == b"500":
                context.set_response_status(500, "deliberate", idx)
            if body == b"phrase":
                context.set_response_status(400, "deliberate\r\nX-Injected: 1", idx)
        return [b"ok"] * len(data)


def unsafe_answer(context, outputs: list) -> list[str]:
    """What in the rows' status phrases and headers would kill a TorchServe worker: a phrase or header netty refuses
    or that is no bounded printable ASCII (handlers.base.safe_header_text), or an answer TorchServe's worker fails to
    encode (it encodes after its handler's try block)."""
    from ts.protocol.otf_message_handler import create_predict_response

    from handlers.base import safe_header_text

    problems = []
    for idx in range(len(outputs)):
        phrase = context.get_response_status(idx)[1]
        if phrase is not None and not safe_header_text(phrase):
            problems.append(f"row {idx}: status phrase {phrase!r:.80}")
        for key, value in context.get_response_headers(idx).items():
            if not (safe_header_text(key) and safe_header_text(value)):
                problems.append(f"row {idx}: header {key!r:.40}: {value!r:.80}")
    try:
        create_predict_response(outputs, {idx: f"request-{idx}" for idx in range(len(outputs))}, "Prediction success", 200, context)
    except Exception as error:
        problems.append(f"TorchServe's create_predict_response raised {type(error).__name__}: {error}"[:200])
    return problems


def make_handler(target: str, model_dir: Path):
    if target == "selftest":
        return SelfTest()
    from handlers.areas import AreasHandler
    from handlers.jpeg import JpegHandler
    from handlers.pipeline import PipelineHandler
    from handlers.segmentation import SegmentationHandler
    from segserve.model.worker_context import worker_context

    kind = {"seg": SegmentationHandler, "jpeg": JpegHandler, "areas": AreasHandler, "fused": PipelineHandler}[target]
    handler = kind()
    handler.initialize(worker_context(model_dir, handler_settings(CONFIGS[target]), "seg.pt"))
    return handler


def send(stream, message) -> None:
    data = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def serve(model_dir: Path, targets: list[str]) -> None:
    """The child's loop: (target, bodies) in on stdin, {statuses, outputs, error} out on the original stdout."""
    import faulthandler

    from segserve.model.worker_context import worker_context

    faulthandler.enable()  # on a crash, the Python stack goes to stderr: the report names the frame
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for the stack of a hang
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the replies
    handlers = {target: make_handler(target, model_dir) for target in targets}
    send(replies, "ready")
    requests = sys.stdin.buffer
    while header := requests.read(8):
        target, bodies = pickle.loads(requests.read(struct.unpack("<Q", header)[0]))
        context = worker_context(None, {}, rows=len(bodies))
        try:  # bytearrays, as TorchServe hands bodies over
            outputs = handlers[target].handle([{"body": bytearray(body)} for body in bodies], context)
            statuses = [context.get_response_status(i)[0] for i in range(len(bodies))]
            unsafe = unsafe_answer(context, outputs)
            send(replies, {"statuses": statuses, "outputs": outputs, "error": None, "unsafe": unsafe})
        except Exception as error:
            send(replies, {"statuses": None, "outputs": None, "error": f"{type(error).__name__}: {error}", "unsafe": []})


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2].split(","))
