"""An aiohttp application served on one address: what the REST front end and the
metrics/status server share. Subclasses build the application in ``web_app()``."""

from __future__ import annotations

import logging

from aiohttp import web

log = logging.getLogger("tfscache.webserver")


class WebServer:
    """``start()`` returns once serving, with the bound port (port 0 picks a free one)."""

    what = "HTTP server"  # for the log line

    def __init__(self, bind_address: str, port: int) -> None:
        self._bind = (bind_address, port)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def web_app(self) -> web.Application:
        raise NotImplementedError

    async def start(self) -> int:
        self._runner = web.AppRunner(self.web_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._bind[0], self._bind[1], reuse_port=False)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("%s serving on %s:%s", self.what, self._bind[0], self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
