"""A TCP relay in front of the apiserver that holds every client-to-server chunk a while: an apiserver a network hop
away, or a loaded one. TLS passes through untouched. Used by bench/operator_resync.py and the operator's tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from pathlib import Path

import yaml


class Relay:
    """Listens on 127.0.0.1:`port` and relays to `upstream`, holding every client-to-server chunk `delay` seconds."""

    def __init__(self, upstream: tuple[str, int], delay: float):
        self.upstream, self.delay = upstream, delay
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the relay did not start")

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_forever()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self._pipe(client_r, server_w, self.delay), self._pipe(server_r, client_w, 0.0),
                             return_exceptions=True)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(OSError):
                writer.close()


def upstream_of(kubeconfig: Path) -> tuple[str, int]:
    """The apiserver's (host, port) in `kubeconfig`."""
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def through_relay(kubeconfig: Path, delay: float, path: Path) -> tuple[Relay, Path]:
    """A relay to `kubeconfig`'s apiserver and, at `path`, a copy of `kubeconfig` whose server is the relay (same host
    name, so TLS verifies as before)."""
    relay = Relay(upstream_of(kubeconfig), delay)
    config = yaml.safe_load(kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    config["clusters"][0]["cluster"]["server"] = server.rsplit(":", 1)[0] + f":{relay.port}"
    path.write_text(yaml.safe_dump(config))
    return relay, path
