"""Known slowdowns for a real Mosquitto, to prove the regression detector on them (tests and
bench/bench_capacity.py). Each changes the broker in a way that can be computed:

- `build_burn_plugin`: the Mosquitto plugin of burn.c, which spends a set number of
  microseconds of the broker's own CPU time on every PUBLISH it receives, so the broker's
  CPU-seconds per 10,000 messages rise by exactly 10,000 x burn_us / 1e6;
- `ThrottledProxy`: a TCP proxy in front of the broker whose broker-to-client direction
  shares one token bucket, so the broker can deliver at most `rate` bytes per second: a
  capacity known exactly, in messages per second, from the size of a PUBLISH packet.

For perfpipe's own tests and benchmarks only; nothing here touches a host's settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from tasks.ports import free_port

SOURCE = Path(__file__).resolve().parent / "burn.c"
# Mosquitto loads plugins after dropping root to its own user: the library must be
# readable by that user, so it is built outside any private temporary folder.
PLUGIN_DIR = Path("/var/tmp/perfpipe-slowdown")


def build_burn_plugin() -> Path:
    """burn.c compiled once per source version; returns the shared library's path."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = PLUGIN_DIR / f"burn-{digest}.so"
    if target.exists():
        return target
    if not Path("/usr/include/mosquitto_plugin.h").exists():
        raise RuntimeError("mosquitto_plugin.h is missing: install mosquitto-dev and "
                           "libmosquitto-dev (make deps does)")
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler: install gcc")
    PLUGIN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(PLUGIN_DIR, 0o755)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE)],
                   check=True, capture_output=True, text=True, timeout=120)
    os.chmod(partial, 0o755)
    partial.replace(target)
    return target


def burn_config(plugin: Path, burn_us: int) -> list[str]:
    """The mosquitto.conf lines that load the plugin with `burn_us` per message."""
    return [f"plugin {plugin}", f"plugin_opt_burn_us {int(burn_us)}"]


def unmanaged_inventory(path: Path, proxy_port: int, broker_dir: Path,
                        search_procs: int | None = None) -> Path:
    """An inventory, written at `path`, for a Mosquitto somebody else runs on this machine
    (started with its config in `broker_dir`) and reached through the proxy on
    `proxy_port`: perfpipe finds its processes by their command line, as a user would.
    One driver process, or `search_procs` for a max-rate search's probes and holds."""
    searching = f", search_procs: {search_procs}" if search_procs else ""
    path.write_text(
        f"hosts: [{{name: localhost, transport: local, roles: [driver], procs: 1{searching}}}]\n"
        "broker: {kind: mosquitto, host: localhost, managed: false, address: 127.0.0.1, "
        f"port: {proxy_port}, processes: {{match: 'mosquitto -c {broker_dir}/'}}}}\n")
    return path


class ThrottledProxy:
    """A TCP proxy on a free loopback port in front of `upstream`: client-to-broker bytes
    pass freely, broker-to-client bytes of every connection together at most `rate` bytes/s
    (a token bucket with a 64 KB burst). Runs its own event loop in a thread; `rate` may be
    changed while it runs."""

    def __init__(self, upstream: int, rate: float) -> None:
        self.upstream, self.rate, self.port = upstream, rate, free_port()
        self.loop = asyncio.new_event_loop()
        self.tokens, self.burst = 0.0, 65536.0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the proxy did not start")

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.stamp = self.loop.time()
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_forever()
        server.close()

    async def _take(self, n: int) -> None:
        while True:
            now = self.loop.time()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= n:
                self.tokens -= n
                return
            await asyncio.sleep((n - self.tokens) / self.rate)

    async def _client(self, client_r, client_w) -> None:
        broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        await asyncio.gather(self._pump(client_r, broker_w, throttled=False),
                             self._pump(broker_r, client_w, throttled=True),
                             return_exceptions=True)

    async def _pump(self, reader, writer, throttled: bool) -> None:
        try:
            while data := await reader.read(4096):
                if throttled:
                    await self._take(len(data))
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
