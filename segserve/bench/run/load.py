"""Load generator: closed or open loop over hand-written keep-alive HTTP/1.1 (or TorchServe's gRPC inference API, a
url grpc://host:port: grpc_load.py), recording every request.

Closed loop: `concurrency` connections, each sends its next request when the previous response arrives.
Open loop: send times are fixed up front (`arrival_schedule`); a request waits for a free connection and its
latency counts from its intended send time, so a server that queues cannot hide it (coordinated omission).
Every request ends up in the result: an HTTP status, 0 for a connection error, -1 for a timeout. A failed one (any
other than 2xx) also with the input it was sent, and the first answer of each kind (status × input) as its sample:
what a success costs is unchanged, and a failure costs a tuple.
"""

import asyncio
import bisect
import ipaddress
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

CONNECTION_ERROR = 0
TIMEOUT = -1
ARRIVALS = ("constant", "poisson")
# After a connection error a closed-loop connection waits this long before reconnecting: against a dead server
# the loop would otherwise spin, recording failures by the million and starving the stop_early check.
RECONNECT_PAUSE_S = 0.01
STATUS_NAMES = {CONNECTION_ERROR: "connection_error", TIMEOUT: "timeout"}  # the others by their number
SAMPLE_BYTES = 300  # of the first answer of each kind of failure: enough for an error message, bounded for a storm


class Body(bytes):
    """A request body that is sent with its own Content-Type (JSON, multipart), and may carry its input's name (a
    file's: failed requests are counted by it); plain bytes go as the spec's content_type, counted by their index.
    `parts`: named inputs (a join's parents' answers, inputs.named_inputs), which go over gRPC, one entry of the
    request's input map each (grpc_load.request_bytes); the bytes are then the same row as multipart/form-data.
    Here, not in inputs.py: a load process unpickles it without importing torch."""

    def __new__(cls, data: bytes, content_type: str, name: str | None = None, parts: dict[str, bytes] | None = None):
        body = super().__new__(cls, data)
        body.content_type, body.name, body.parts = content_type, name, parts
        return body

    def __reduce__(self):  # to a load process (spawn): bytes' own pickling would call __new__ without content_type
        return Body, (bytes(self), self.content_type, self.name, self.parts)


@dataclass
class LoadSpec:
    url: str  # base URL, loopback only: "http://127.0.0.1:8080", or "grpc://127.0.0.1:7070" (TorchServe's gRPC inference API)
    path: str  # grpc://: the model's name (or name/version)
    bodies: list[bytes]  # used round-robin, one counter across all connections
    token: str | None = None
    concurrency: int = 1  # closed loop: connections; open loop: the most requests in flight
    request_rate_rps: float | None = None  # None: closed loop
    arrival: str = "constant"
    seed: int = 0
    timeout_s: float = 30.0
    content_type: str = "application/octet-stream"  # of a body without its own (Body)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request (an http target's, e.g. Authorization)

    def __post_init__(self):
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "grpc") or not parts.hostname:
            raise ValueError(
                f"{self.url!r}: the load generator speaks plain HTTP or TorchServe's gRPC; give a base URL like 'http://127.0.0.1:8080'"
                " or 'grpc://127.0.0.1:7070'"
            )
        if not _is_loopback(parts.hostname):
            raise ValueError(f"{self.url!r}: the load generator only sends to loopback; give a URL like 'http://127.0.0.1:8080'")
        if parts.scheme == "http" and not self.path.startswith("/"):
            raise ValueError(f"{self.path!r}: path must start with '/', like '/predictions/seg'")
        if parts.scheme == "grpc" and (not self.path or self.path.startswith("/")):
            raise ValueError(f"{self.path!r}: over gRPC the path is a model's name (or name/version), like 'seg'")
        if not self.bodies:
            raise ValueError("bodies is empty: give at least one request body")
        if self.concurrency < 1:
            raise ValueError(f"{self.concurrency}: concurrency must be at least 1")
        if self.request_rate_rps is not None and self.request_rate_rps <= 0:
            raise ValueError(f"{self.request_rate_rps}: request_rate_rps must be positive, or None for a closed loop")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"{self.arrival!r}: arrival must be one of {', '.join(ARRIVALS)}")


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost
        return False


@dataclass
class LoadResult:
    # One entry per request, in completion order; offsets in seconds since the run's start.
    intended_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)  # HTTP status, 0 connection error, -1 timeout
    wall_s: float = 0.0
    client_cpu_s: float = 0.0  # process CPU time over the run (every thread of this process)
    # The failed requests alone, (end_s, status, input index), and the first answer's first SAMPLE_BYTES of each
    # kind (status, input index): a body, or for a timeout or connection error what happened.
    failed: list[tuple[float, int, int]] = field(default_factory=list)
    samples: dict[tuple[int, int], bytes] = field(default_factory=dict)

    def record(self, intended_s: float, end_s: float, status: int, input_index: int = 0, answer: bytes = b"") -> None:
        self.intended_s.append(intended_s)
        self.end_s.append(end_s)
        self.latency_ms.append((end_s - intended_s) * 1000)
        self.status.append(status)
        if not 200 <= status < 300:
            self.failed.append((end_s, status, input_index))
            if (status, input_index) not in self.samples:
                self.samples[status, input_index] = bytes(answer[:SAMPLE_BYTES])

    def window(self, from_s: float, to_s: float) -> "LoadResult":
        """The requests that ended in [from_s, to_s); CPU time is prorated by the window's share of the run."""
        return self.windows([(from_s, to_s)])

    def windows(self, spans: list[tuple[float, float]]) -> "LoadResult":
        """The requests that ended in any of the [from_s, to_s) spans (disjoint), as one result of their total time."""
        keep = [i for i, end in enumerate(self.end_s) if any(a <= end < b for a, b in spans)]
        span_s = sum(b - a for a, b in spans)
        failed = [f for f in self.failed if any(a <= f[0] < b for a, b in spans)]
        kinds = {(status, index) for _, status, index in failed}
        return LoadResult(
            [self.intended_s[i] for i in keep],
            [self.end_s[i] for i in keep],
            [self.latency_ms[i] for i in keep],
            [self.status[i] for i in keep],
            wall_s=span_s,
            client_cpu_s=self.client_cpu_s * span_s / self.wall_s if self.wall_s > 0 else 0.0,
            failed=failed,
            samples={kind: body for kind, body in self.samples.items() if kind in kinds},
        )

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(status_name(status) for status in self.status))

    @property
    def ok(self) -> list[bool]:
        return [200 <= status < 300 for status in self.status]

    def rate_rps(self, from_s: float, to_s: float) -> float:
        """Successful completions per second over the window [from_s, to_s), with both edges moved forward onto
        the first success at or after them. A server that answers in batches completes 8 requests at once: with
        fixed edges a 0.6 s window counts 32 or 40 of them (±13%) by where its edge falls between two batches;
        between completions it counts whole batches over the time they took. Adjacent windows stay adjacent."""
        ends = sorted(end for end, ok in zip(self.end_s, self.ok, strict=True) if ok)
        start, stop = bisect.bisect_left(ends, from_s), bisect.bisect_left(ends, to_s)
        if start >= len(ends) or ends[start] >= to_s:
            return 0.0  # nothing succeeded in the window
        if stop >= len(ends):  # nothing after the window yet: its own edge
            return (stop - start) / (to_s - ends[start])
        return (stop - start) / (ends[stop] - ends[start])


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, str(status))


def arrival_schedule(rate_rps: float, duration_s: float, arrival: str = "constant", seed: int = 0) -> list[float]:
    """Intended send times in [0, duration_s): every 1/rate, or a Poisson process (exponential gaps) from `seed`."""
    if arrival not in ARRIVALS:
        raise ValueError(f"{arrival!r}: arrival must be one of {', '.join(ARRIVALS)}")
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0 if arrival == "constant" else rng.expovariate(rate_rps)
    while t < duration_s:
        times.append(t)
        # Constant times are computed from the index, not summed, so they do not drift.
        t = len(times) / rate_rps if arrival == "constant" else t + rng.expovariate(rate_rps)
    return times


class _Connection:
    """One keep-alive connection: opened on first use, and again after the server closes it or it breaks."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.replied = False

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        """(status, body): the body as read (a chunked one: its first SAMPLE_BYTES at least)."""
        reused = self.writer is not None
        try:
            return await self._exchange_once(request)
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
            self.close()
            # A kept-alive connection the server closed while idle fails before any reply: resend once on a new one.
            if reused and not self.replied:
                return await self._exchange_once(request)
            raise

    async def _exchange_once(self, request: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.replied = False
        # No drain(): the response cannot arrive before the whole request is sent, so waiting for it is flow control.
        self.writer.write(request)
        status, headers, version = await self._read_head()
        self.replied = True
        body = b""
        if headers.get(b"transfer-encoding", b"").endswith(b"chunked"):
            body = await self._skip_chunks()
        elif b"content-length" in headers:
            body = await self.reader.readexactly(int(headers[b"content-length"]))
        elif status >= 200 and status not in (204, 304):
            body = await self.reader.read()  # no length given: the body runs to the end of the connection
            headers[b"connection"] = b"close"
        if headers.get(b"connection") == b"close" or (version == b"http/1.0" and headers.get(b"connection") != b"keep-alive"):
            self.close()
        return status, body

    async def _read_head(self) -> tuple[int, dict[bytes, bytes], bytes]:
        while True:
            lines = (await self.reader.readuntil(b"\r\n\r\n")).lower().split(b"\r\n")
            version, status = lines[0].split(b" ", 2)[:2]
            if not 100 <= int(status) < 200:  # an interim 1xx is followed by the real response
                break
        headers = {name.strip(): value.strip() for name, _, value in (line.partition(b":") for line in lines[1:])}
        return int(status), headers, version

    async def _skip_chunks(self) -> bytes:
        """Read a chunked body; its first chunks, up to SAMPLE_BYTES, are returned (a failure's sample)."""
        start = b""
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunk = await self.reader.readexactly(size + 2)
            if len(start) < SAMPLE_BYTES:
                start += chunk[:-2]
        while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailers, ended by an empty line
            pass
        return start

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def aclose(self) -> None:
        self.close()


async def _send(connection: _Connection, request: bytes, timeout_s: float) -> tuple[int, bytes]:
    """(status, the answer's body, or for a connection error the exception; b"" for a timeout)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await connection.exchange(request)
    except TimeoutError:  # before OSError: TimeoutError is one
        connection.close()
        return TIMEOUT, b""
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as error:  # ValueError: a malformed reply
        connection.close()
        return CONNECTION_ERROR, f"{type(error).__name__}: {error}".encode()


class _Run:
    def __init__(self, spec: LoadSpec):
        self.spec = spec
        parts = urlsplit(spec.url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.grpc = parts.scheme == "grpc"
        if self.grpc:  # imported here: grpcio and protoc load only for a gRPC run
            from segserve.bench.run import grpc_load

            self.grpc_connection = grpc_load.GrpcConnection
            self.requests = [grpc_load.request_bytes(spec.path, body) for body in spec.bodies]
        else:
            self.requests = self._http_requests(spec, parts)
        self.sent = 0
        self.connections: list = []  # _Connection or grpc_load.GrpcConnection
        self.in_flight: set[asyncio.Task] = set()
        self.result = LoadResult()
        self.stop_s: float | None = None
        self.sleeping_until_s: float | None = None
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()

    @staticmethod
    def _http_requests(spec: LoadSpec, parts) -> list[bytes]:
        head = f"POST {spec.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        if spec.token:
            head += f"Authorization: Bearer {spec.token}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in spec.headers.items())
        return [
            (head + f"Content-Type: {getattr(body, 'content_type', spec.content_type)}\r\nContent-Length: {len(body)}\r\n\r\n").encode(
                "latin-1"
            )
            + body
            for body in spec.bodies
        ]

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def next_request(self) -> tuple[int, bytes]:
        """(the input's index in spec.bodies, its request)."""
        index = self.sent % len(self.requests)
        self.sent += 1
        return index, self.requests[index]

    def connection(self):
        if self.grpc:
            self.connections.append(self.grpc_connection(self.host, self.port, self.spec.token))
        else:
            self.connections.append(_Connection(self.host, self.port))
        return self.connections[-1]

    def snapshot(self) -> LoadResult:
        r = self.result
        return LoadResult(
            list(r.intended_s), list(r.end_s), list(r.latency_ms), list(r.status), self.now_s(), time.process_time() - self.cpu0,
            list(r.failed), dict(r.samples),
        )  # fmt: skip

    async def closed_loop(self) -> None:
        connection = self.connection()
        while self.stop_s is None:
            intended_s = self.now_s()
            index, request = self.next_request()
            status, answer = await _send(connection, request, self.spec.timeout_s)
            self.result.record(intended_s, self.now_s(), status, index, answer)
            if status == CONNECTION_ERROR:
                await asyncio.sleep(RECONNECT_PAUSE_S)

    async def open_loop(self, schedule: list[float]) -> None:
        idle: asyncio.Queue[_Connection] = asyncio.Queue()
        for _ in range(self.spec.concurrency):
            idle.put_nowait(self.connection())
        for intended_s in schedule:
            if self.stop_s is not None and intended_s >= self.stop_s:
                return
            if (delay_s := intended_s - self.now_s()) > 0:
                self.sleeping_until_s = intended_s
                await asyncio.sleep(delay_s)
                self.sleeping_until_s = None
            index, request = self.next_request()
            # The timeout counts from the intended time, like the latency: waiting for a connection uses it up too.
            try:
                async with asyncio.timeout(intended_s + self.spec.timeout_s - self.now_s()):
                    connection = await idle.get()
            except TimeoutError:
                self.result.record(intended_s, self.now_s(), TIMEOUT, index)
                continue
            task = asyncio.create_task(self.open_request(connection, index, request, intended_s, idle))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)

    async def open_request(self, connection: _Connection, index: int, request: bytes, intended_s: float, idle: asyncio.Queue) -> None:
        status, answer = await _send(connection, request, intended_s + self.spec.timeout_s - self.now_s())
        self.result.record(intended_s, self.now_s(), status, index, answer)
        idle.put_nowait(connection)

    async def run(self, duration_s: float, stop_early: Callable[[LoadResult], bool] | None, check_every_s: float) -> LoadResult:
        spec = self.spec
        if spec.request_rate_rps is None:
            senders = [asyncio.create_task(self.closed_loop()) for _ in range(spec.concurrency)]
        else:
            senders = [asyncio.create_task(self.open_loop(arrival_schedule(spec.request_rate_rps, duration_s, spec.arrival, spec.seed)))]
        try:
            next_check_s = check_every_s
            # A sender that finishes early has crashed (closed loop) or sent its whole schedule (open loop).
            while (now_s := self.now_s()) < duration_s and not any(task.done() for task in senders):
                if now_s >= next_check_s:
                    # Advance past now even when a check ran long (or there is none): the wait below must not spin.
                    while next_check_s <= now_s:
                        next_check_s += check_every_s
                    if stop_early is not None and stop_early(self.snapshot()):
                        break
                await asyncio.wait(senders, timeout=min(next_check_s, duration_s) - now_s, return_when=asyncio.FIRST_COMPLETED)
            self.stop_s = self.now_s()
            # Stop a dispatcher asleep until a time after the stop; one waiting for a connection still owes due requests.
            if self.sleeping_until_s is not None and self.sleeping_until_s >= self.stop_s:
                senders[0].cancel()
            await asyncio.wait(senders)
            for task in senders:
                if not task.cancelled():
                    task.result()  # re-raise a sender's crash rather than return a partial result
            await asyncio.gather(*self.in_flight)
        finally:
            await asyncio.gather(*(connection.aclose() for connection in self.connections))
        self.result.wall_s, self.result.client_cpu_s = self.now_s(), time.process_time() - self.cpu0
        return self.result


def run_load(
    spec: LoadSpec, duration_s: float, stop_early: Callable[[LoadResult], bool] | None = None, check_every_s: float = 1.0
) -> LoadResult:
    """Send load for at most duration_s seconds. Every check_every_s, call stop_early(result_so_far) and stop when it
    returns True. Requests still in flight when the run stops are awaited (bounded by timeout_s) and recorded; in open
    loop that includes requests already due but still waiting for a connection. wall_s runs until the last is recorded."""
    if check_every_s <= 0:
        raise ValueError(f"{check_every_s}: check_every_s must be positive, like 1.0")
    return asyncio.run(_Run(spec).run(duration_s, stop_early, check_every_s))
