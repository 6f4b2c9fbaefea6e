"""A small server for command-target tests, started by the suite as a peer would be:
`python command_server.py --port P --delay-ms D --busy-ms B --mode MODE --started-log FILE`.

Each POST sleeps D ms and then computes for B ms (a profile needs a process seen busy: py-spy leaves idle samples
out, and a server that only sleeps and answers was busy in none of 200 samples in a run of make test).

MODE plain: answers POST /predict with 200 and the body's length; v2: checks a KServe v2 binary request (its
JSON header's length in Inference-Header-Content-Length, one BYTES element of tensor `image`) and answers 400 for a
malformed one; fail: writes a reason to stderr and exits 3 before listening; orphan: starts a child that outlives
it, then exits 3; native: plain, beside a child that is not Python (as Triton's server binary beside PyTriton).
/health answers 200 once listening. Each start appends its argv as a JSON line to FILE.
"""

import argparse
import http.server
import json
import struct
import subprocess
import sys
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_s = 0.0
    busy_s = 0.0
    mode = "plain"

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.answer(200 if self.path == "/health" else 404, b"ok")

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay_s)
        busy_until = time.perf_counter() + self.busy_s
        while time.perf_counter() < busy_until:  # on the CPU, in Python, as a model server's own code would be
            pass
        if self.mode == "v2" and not v2_well_formed(body, self.headers.get("Inference-Header-Content-Length")):
            self.answer(400, b"malformed v2 request")
            return
        self.answer(200, str(len(body)).encode())

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def v2_well_formed(body: bytes, header_length: str | None) -> bool:
    if header_length is None:
        return False
    length = int(header_length)
    header = json.loads(body[:length])
    (tensor,) = header["inputs"]
    binary = body[length:]
    (element_length,) = struct.unpack("<I", binary[:4])
    return (
        tensor["name"] == "image"
        and tensor["datatype"] == "BYTES"
        and tensor["parameters"]["binary_data_size"] == len(binary)
        and element_length == len(binary) - 4
        and binary[4:6] == b"\xff\xd8"  # a JPEG's first bytes
        and header["outputs"][0]["parameters"]["binary_data"] is True
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--mode", default="plain")
    parser.add_argument("--started-log", required=True)
    args = parser.parse_args()
    with open(args.started_log, "a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\n")
    if args.mode == "fail":
        sys.exit("no model here: weights/missing.pt")
    if args.mode == "orphan":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        print("crashed, leaving a child behind", file=sys.stderr)
        sys.exit(3)
    if args.mode == "native":
        subprocess.Popen(["sleep", "600"])  # in our process group: stopped with it
    Handler.delay_s, Handler.busy_s, Handler.mode = args.delay_ms / 1000, args.busy_ms / 1000, args.mode
    http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
