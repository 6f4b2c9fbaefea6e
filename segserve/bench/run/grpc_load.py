"""The load generator's gRPC connection: TorchServe's gRPC inference API (`Predictions`), beside HTTP/1.1 (load.py).

The message types are TorchServe's own: inference.proto is read from the frontend's jar (model-server.jar, the
version that serves) and compiled once per process with grpcio-tools' protoc, so a request is what a user's stub of
that release sends. A request is serialised once per body, up front (the HTTP requests are too); each closed-loop
connection is a channel of its own on its own TCP connection, as each HTTP connection is.
"""

import importlib
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import grpc

SERVICE = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"
INPUT_KEY = "data"  # the handlers read a row's "data" or "body"; TorchServe's gRPC passes the input map as the row
# TorchServe 0.12's gRPC API answers a row its handler refused (context.set_response_status(400)) with OK and the
# handler's error body: the status a handler sets reaches HTTP clients only. segserve's handlers answer a refused row
# with a JSON object {"error": ...}; such an answer counts as the 400 it is over HTTP, so that only answers count.
ERROR_ANSWER = b'{"error"'

# gRPC status → the HTTP status the same answer has on the REST API (TorchServe's GRPCUtils maps the other way), so
# that a result counts 2xx the same for both protocols; DEADLINE_EXCEEDED is the load generator's own timeout.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 507,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.INTERNAL: 500,  # TorchServe's answer to an unknown model, too
    grpc.StatusCode.DEADLINE_EXCEEDED: -1,
}


@cache
def inference_messages():
    """TorchServe's inference_pb2 module (PredictionsRequest, PredictionResponse), compiled from its jar's proto."""
    import ts
    from grpc_tools import protoc

    jar = Path(ts.__file__).parent / "frontend" / "model-server.jar"
    out = Path(tempfile.mkdtemp(prefix="segserve-grpc-"))
    with zipfile.ZipFile(jar) as archive:
        (out / "inference.proto").write_bytes(archive.read("inference.proto"))
    # google/protobuf/*.proto come with grpcio-tools, google/rpc/status.proto with googleapis-common-protos
    includes = {Path(protoc.__file__).parent / "_proto"} | {Path(p).parents[1] for p in importlib.import_module("google.rpc").__path__}
    code = protoc.main(["protoc", f"-I{out}", *(f"-I{p}" for p in includes), f"--python_out={out}", str(out / "inference.proto")])
    if code != 0:
        raise RuntimeError(f"protoc could not compile TorchServe's inference.proto from {jar} (exit {code})")
    sys.path.insert(0, str(out))
    return importlib.import_module("inference_pb2")


def request_bytes(model: str, body: bytes) -> bytes:
    """One serialised PredictionsRequest for `model` (name, or name/version) carrying `body` as its input "data", or
    a body of named inputs (load.Body.parts) as one input each. TorchServe makes each input a parameter named by its
    key without a content type (grpcimpl/InferenceImpl.java), which the worker hands over as a bytearray: the row
    {parent: bytearray, ...} a workflow's DagExecutor hands a join, with no multipart body for the frontend to decode."""
    name, _, version = model.partition("/")
    inputs = getattr(body, "parts", None) or {INPUT_KEY: body}
    return inference_messages().PredictionsRequest(model_name=name, model_version=version, input=inputs).SerializeToString()


class GrpcConnection:
    """One channel on a TCP connection of its own (no subchannel shared with the other connections)."""

    def __init__(self, host: str, port: int, token: str | None):
        self.target = f"{host}:{port}"
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel: grpc.aio.Channel | None = None
        self.call = None

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        """(the status the answer would have over HTTP, its body: a refused row's answer, a failed call's details)."""
        if self.channel is None:
            options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 * 2**20)]
            self.channel = grpc.aio.insecure_channel(self.target, options=options)
            # bytes in, bytes out: the request is serialised already, and the answer's bytes are not looked at
            self.call = self.channel.unary_unary(SERVICE, response_deserializer=inference_messages().PredictionResponse.FromString)
        try:
            answer = await self.call(request, metadata=self.metadata)
            return (400, answer.prediction) if answer.prediction.startswith(ERROR_ANSWER) else (200, b"")
        except grpc.aio.AioRpcError as error:
            return HTTP_STATUS.get(error.code(), 500), f"{error.code().name}: {error.details()}".encode()

    def close(self) -> None:
        """After a timeout or an error: nothing to reset (the call was cancelled; the channel reconnects by itself)."""

    async def aclose(self) -> None:
        if self.channel is not None:
            channel, self.channel = self.channel, None
            await channel.close()
