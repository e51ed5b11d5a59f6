"""Mosquitto: the broker the embedded default starts, and the first adapter.

Optional TLS listener: ``Mosquitto.start(..., tls_port=N, tls_names=[...], local_dir=D)``
adds a second listener on port N. Its certificates are throwaway ones generated for the
run (`make_certificates`): a CA whose private key is never written anywhere, and a server
certificate it signs for the broker's address and host name (RSA 2048, as the
MessageSight CONNBURST.SEC test). ``D`` (the run directory's ``broker/tls``) keeps the CA
and the server certificate; the server key only goes to the broker host, into
``<run dir>/broker/tls/server.key`` with mode 0600, owned by the user Mosquitto drops to
when it is started as root (it reads its certificates after dropping privileges); when
that user cannot reach the directory (a run directory under a 0700 home), the key stays
root's and the config says ``user root``.

The generated config sets ``sys_interval 1``, the shortest: Mosquitto 2.0 then publishes
``$SYS/broker/#`` every 2 s (its check is strict on whole seconds), which the broker-side
sampler (`tasks.driver.sampler`) records per second.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..rundir import BROKER_DIR, TLS_DIR
from .base import BrokerAdapter
from .errors import BrokerError
from .health import Launched, bind_address, health_check
from .tls import CA_FILE, CERT_FILE, KEY_FILE, make_certificates

MOSQUITTO_BINARIES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "mosquitto")


def render_config(port: int, bind: str, tls: dict | None = None,
                  extra: list[str] = ()) -> str:
    """A mosquitto.conf for benchmarking: no persistence, queues large enough not to discard,
    $SYS every second; `tls` ({port, cafile, certfile, keyfile, user}) adds a TLS listener
    (`user`: who Mosquitto runs as when started as root, if not its default); `extra`
    lines (the inventory's broker.extra_config) follow the plain listener, before any TLS
    one: a listener option among them (max_connections, protocol) applies to the plain
    listener whether or not the suite has TLS stages (it applied to the TLS one when there
    was one), global ones to the broker."""
    lines = [f"user {tls['user']}"] if tls and tls.get("user") else []
    lines += [
        f"listener {port} {bind}",
        "allow_anonymous true",
        "persistence false",
        "max_queued_messages 1000000",
        "max_inflight_messages 0",
        "sys_interval 1",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        *extra,
    ]
    if tls:
        lines += [
            f"listener {tls['port']} {bind}",
            f"cafile {tls['cafile']}",
            f"certfile {tls['certfile']}",
            f"keyfile {tls['keyfile']}",
        ]
    return "\n".join(lines + [""])


class Mosquitto(BrokerAdapter):
    kind = "mosquitto"
    title = "Mosquitto"
    supports_tls = True
    process_pattern = r"(^|/)mosquitto( |$)"
    cores = 1  # one thread runs every client's network and message work

    def stats_args(self, state: dict, metrics_url: str | None = None) -> list[str]:
        """Its own view comes from $SYS on the address and plain port clients use."""
        return ["--sys", f"{state['address']}:{state['port']}"]

    def binary(self) -> str:
        for candidate in MOSQUITTO_BINARIES:
            if self.host.run(["sh", "-c", 'command -v "$0"', candidate], check=False).ok:
                return candidate
        raise BrokerError(f"{self.host.name}: mosquitto is not installed "
                          f"(apt-get install mosquitto, or `make deps`)")

    def version(self) -> str:
        out = self.host.run([self.binary(), "-h"], check=False).stdout
        match = re.search(r"mosquitto version (\S+)", out)
        return match.group(1) if match else "unknown"

    def _run_as(self) -> str | None:
        """The user Mosquitto will run as, when it differs from the login user: started as
        root, it drops to `mosquitto` (`nobody` when that user does not exist)."""
        if self.host.run(["id", "-u"]).stdout.strip() != "0":
            return None
        return "mosquitto" if self.host.run(["id", "-u", "mosquitto"], check=False).ok else "nobody"

    def install_tls(self, run_dir: str, local_dir: Path, names: list[str]) -> dict:
        """Generate the run's CA and server certificate and put them on the broker host;
        the key is written there with mode 0600, readable only by the broker's user."""
        made = make_certificates(local_dir, names)
        remote = f"{run_dir}/{TLS_DIR}"
        self.host.run(["mkdir", "-p", remote])
        self.host.run(["chmod", "0700", remote])
        files = {"cafile": f"{remote}/{CA_FILE}", "certfile": f"{remote}/{CERT_FILE}",
                 "keyfile": f"{remote}/{KEY_FILE}"}
        self.host.put(made["ca"], files["cafile"])
        self.host.put(made["cert"], files["certfile"])
        # an empty 0600 file first, so the key is never readable by others, not even briefly
        self.host.run(["sh", "-c", 'umask 077 && : >"$0" && chmod 0600 "$0"', files["keyfile"]])
        handle, local_key = tempfile.mkstemp(prefix="perfpipe-key-")  # mode 0600
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(made["key_pem"])
            self.host.put(Path(local_key), files["keyfile"])
        finally:
            os.unlink(local_key)
        self.host.run(["chmod", "0600", files["keyfile"]])
        owner, user = self._run_as(), None
        if owner:
            self.host.run(["chown", "-R", owner, remote])
            check = self.host.run(["runuser", "-u", owner, "--", "test", "-r",
                                   files["keyfile"]], check=False)
            if check.exited not in (0, 127):  # a parent directory it cannot enter (0700)
                self.host.run(["chown", "-R", "root", remote])
                user = "root"  # then Mosquitto must not drop privileges to read its key
        return {**files, "local_ca": str(made["ca"]), "names": list(dict.fromkeys(names)),
                "user": user}

    def start(self, run_dir: str, address: str, port: int, *, tls_port: int | None = None,
              tls_names: list[str] | None = None, local_dir: Path | None = None,
              extra_config: list[str] = ()) -> dict:
        """Write the config, start the broker detached, wait until it answers CONNECT (and,
        with `tls_port`, a CONNECT over TLS that verifies the generated certificate)."""
        conf = f"{run_dir}/{BROKER_DIR}/mosquitto.conf"
        log = f"{run_dir}/{BROKER_DIR}/mosquitto.log"
        self.host.mkdir(f"{run_dir}/{BROKER_DIR}")
        tls = None
        if tls_port:
            if local_dir is None:
                raise ValueError("a TLS listener needs local_dir for its CA")
            tls = {"port": tls_port, **self.install_tls(run_dir, local_dir,
                                                        tls_names or [address])}
        self.host.put_text(render_config(port, bind_address(address), tls, extra_config), conf)
        group = self.launch([self.binary(), "-c", conf], log)
        launched = Launched(self.host, log)
        try:
            health_check(address, port, launched=launched)
            if tls:
                health_check(address, tls_port, ca_file=tls["local_ca"], launched=launched)
        except BrokerError as exc:
            self.host.kill_group(group)
            raise BrokerError(f"{self.host.name}: mosquitto did not come up on {port} "
                              f"({exc}); see {log}") from None
        pid = int(self.host.read_text(log + ".pid").strip())
        state = {"group_pid": group, "pid": pid, "config": conf, "log": log}
        if tls:
            state["tls"] = {"port": tls_port, "ca_file": tls["cafile"],
                            "local_ca_file": tls["local_ca"], "names": tls["names"],
                            "key_file": tls["keyfile"]}
            if tls["user"]:
                state["tls"]["runs_as"] = tls["user"]
        return state

    def stop(self, group_pid: int, timeout_s: float = 10.0) -> None:
        self.host.stop_group(group_pid, timeout_s)
