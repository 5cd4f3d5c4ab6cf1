"""A TCP proxy in user space that adds a delay to every byte it forwards (this kernel has no netem).

    python delayproxy.py --listen 10.231.N.10 --forward 8500=127.0.0.1:8500 --forward 8503=127.0.0.1:8503 \
        --delayed 8500 --delay-file DIR/delay --ready-file DIR/proxy.ready

Each ``--forward PORT=HOST:PORT`` listens on ``--listen``:PORT and forwards each connection to
HOST:PORT. On the ``--delayed`` ports every chunk read, in either direction, is written on
``delay`` seconds after it arrived (a queue per direction: latency, not a throughput limit,
and the order kept). ``delay`` is read from ``--delay-file`` (seconds as text; missing: 0) at
start and again on SIGHUP. The ready file is written once every port listens.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path


class Proxy:
    def __init__(self, delay_file: Path) -> None:
        self.delay_file = delay_file
        self.delay = 0.0
        self.read_delay()

    def read_delay(self) -> None:
        try:
            self.delay = float(self.delay_file.read_text().strip() or 0)
        except (OSError, ValueError):
            self.delay = 0.0

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                queue.put_nowait((time.monotonic() + (self.delay if delayed else 0.0), data))
            queue.put_nowait((0.0, None))
            await sender
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            sender.cancel()
        finally:
            if not sender.done():
                await asyncio.wait([sender], timeout=self.delay + 1)
                sender.cancel()

    def handler(self, target: tuple[str, int], delayed: bool):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(self.pipe(reader, up_writer, delayed), self.pipe(up_reader, writer, delayed),
                                     return_exceptions=True)
            finally:
                up_writer.close()
                writer.close()
        return handle


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--forward", action="append", default=[], help="PORT=HOST:PORT")
    parser.add_argument("--delayed", default="", help="comma-separated listening ports that get the delay")
    parser.add_argument("--delay-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args()
    proxy = Proxy(args.delay_file)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, proxy.read_delay)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    delayed = {int(p) for p in args.delayed.split(",") if p}
    servers = []
    for spec in args.forward:
        port, target = spec.split("=")
        host, target_port = target.rsplit(":", 1)
        servers.append(await asyncio.start_server(proxy.handler((host, int(target_port)), int(port) in delayed),
                                                  args.listen, int(port), reuse_address=True))
    args.ready_file.write_text("ready\n")
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
