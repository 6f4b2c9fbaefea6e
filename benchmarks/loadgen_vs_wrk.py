"""Is our load generator the bottleneck? Compare its closed-loop throughput with wrk's on the same server.

    python benchmarks/loadgen_vs_wrk.py --url http://127.0.0.1:8080 --path /predictions/jpeg --body samples/x.jpg \\
        --token TOKEN --connections 8 --duration-s 10 --repeats 3

Runs ours and wrk alternately, --repeats times each, and prints the median throughput of each and the ratio
ours/wrk. Without --url it starts a trivial loopback HTTP server in its own process, which measures the
generators themselves: there, a ratio well below 1 means ours saturates before the server does.
"""

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from segserve.bench.run.load import LoadSpec, run_load  # noqa: E402

TRIVIAL_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class _TrivialHTTP(asyncio.Protocol):
    """Answers every request with a fixed 200; enough parsing to find where each request ends."""

    def connection_made(self, transport):
        self.transport, self.buffer = transport, bytearray()

    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buffer[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            length = int(head[at + 17 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            del self.buffer[: end + 4 + length]
            self.transport.write(TRIVIAL_RESPONSE)


async def _serve_forever() -> None:
    server = await asyncio.get_running_loop().create_server(_TrivialHTTP, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)  # the parent reads the port from here
    await server.serve_forever()


def start_trivial_server() -> tuple[subprocess.Popen, str]:
    """A separate process, so the server and the generator under test do not share one interpreter lock."""
    process = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    return process, f"http://127.0.0.1:{port}"


def ours(args, body: bytes) -> tuple[float, str]:
    spec = LoadSpec(
        url=args.url, path=args.path, bodies=[body], token=args.token, concurrency=args.connections, content_type=args.content_type
    )
    result = run_load(spec, args.duration_s)
    cpu_pct = 100 * result.client_cpu_s / result.wall_s
    return len(result.status) / result.wall_s, f"statuses {result.status_counts()}, client CPU {cpu_pct:.0f}% of one core"


def wrk_lua(args, body_path: Path) -> str:
    # Long brackets quote the path and token without escaping; the body is read as bytes, so any file works.
    lines = [
        'wrk.method = "POST"',
        f'local f = assert(io.open([==[{body_path}]==], "rb"))',
        "wrk.body = f:read('*a')",
        "f:close()",
        f'wrk.headers["Content-Type"] = [==[{args.content_type}]==]',
    ]
    if args.token:
        lines.append(f'wrk.headers["Authorization"] = [==[Bearer {args.token}]==]')
    return "\n".join(lines) + "\n"


def wrk(args, script: Path) -> tuple[float, str]:
    command = ["wrk", "-t", "1", "-c", str(args.connections), "-d", f"{args.duration_s:g}s", "--timeout", "30s", "-s", str(script)]
    output = subprocess.run(command + [args.url + args.path], capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s*([\d.]+)", output)
    if match is None:
        raise RuntimeError(f"no 'Requests/sec:' line in wrk's output:\n{output}")
    errors = [line.strip() for line in output.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    return float(match.group(1)), "; ".join(errors) or "no errors reported"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="base URL of the server (loopback); omitted: start a trivial server")
    parser.add_argument("--path", default="/predictions/jpeg")
    parser.add_argument("--body", type=Path, help="request body file; omitted: 1 KiB of zeros")
    parser.add_argument("--token")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the trivial server's own process
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve_forever())
        return 0
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk); nothing to compare against")
        return 0

    server = None
    if args.url is None:
        server, args.url = start_trivial_server()
        print(f"no --url: started a trivial server at {args.url} (pid {server.pid})")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            body_path = args.body or Path(tmp) / "body.bin"
            if args.body is None:
                body_path.write_bytes(bytes(1024))
            script = Path(tmp) / "post.lua"
            script.write_text(wrk_lua(args, body_path.resolve()))
            body = body_path.read_bytes()
            rates = {"ours": [], "wrk": []}
            for repeat in range(args.repeats):
                for name, measure in (("ours", lambda: ours(args, body)), ("wrk", lambda: wrk(args, script))):
                    rate_rps, note = measure()
                    rates[name].append(rate_rps)
                    print(f"repeat {repeat + 1}/{args.repeats} {name:4}: {rate_rps:9.0f} req/s ({note})", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    ours_rps, wrk_rps = statistics.median(rates["ours"]), statistics.median(rates["wrk"])
    print(f"median throughput: ours {ours_rps:.0f} req/s, wrk {wrk_rps:.0f} req/s, ours/wrk = {ours_rps / wrk_rps:.2f}")
    print(f"({args.connections} connections, {args.duration_s:g} s per run, {args.repeats} runs each, wrk -t 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
