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

import datetime
import ipaddress
import os
import re
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from ..hosts import Host

MOSQUITTO_BINARIES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "mosquitto")


class BrokerError(RuntimeError):
    """The broker could not be started, reached or stopped; the message says which host."""


TLS_DIR = "broker/tls"  # in the run directory, locally and on the broker host
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "server.pem", "server.key"
GENERATED_CA = "perfpipe-ca.pem"  # a tls.ca_file with this name gets perfpipe's generated CA


def render_config(port: int, bind: str, tls: dict | None = None) -> str:
    """A mosquitto.conf for benchmarking: no persistence, queues large enough not to discard,
    $SYS every second; `tls` ({port, cafile, certfile, keyfile, user}) adds a TLS listener
    (`user`: who Mosquitto runs as when started as root, if not its default)."""
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
    ]
    if tls:
        lines += [
            f"listener {tls['port']} {bind}",
            f"cafile {tls['cafile']}",
            f"certfile {tls['certfile']}",
            f"keyfile {tls['keyfile']}",
        ]
    return "\n".join(lines + [""])


def subject_alt_name(name: str):
    """A certificate's subjectAltName entry for `name`: an IP address when it is one, else a
    DNS name."""
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_certificates(out_dir: Path, names: list[str], key_bits: int = 2048,
                      days: int = 2) -> dict[str, Path | bytes]:
    """A throwaway CA and a server certificate it signs for `names` (IP addresses and DNS
    names, all put in subjectAltName). Writes ca.pem and server.pem into out_dir; returns
    their paths and the server key as PEM bytes (written by the caller where it belongs).
    The CA key exists only in memory: nothing else can ever be signed with it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=key_bits)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "perfpipe throwaway CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_bits)
    alt = [subject_alt_name(name) for name in dict.fromkeys(names)]
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
              .issuer_name(ca_name).public_key(key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(start).not_valid_after(end)
              .add_extension(x509.SubjectAlternativeName(alt), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                  ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    (out_dir / CA_FILE).write_bytes(ca.public_bytes(pem))
    (out_dir / CERT_FILE).write_bytes(server.public_bytes(pem))
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    return {"ca": out_dir / CA_FILE, "cert": out_dir / CERT_FILE, "key_pem": key_pem}


def bind_address(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return "0.0.0.0"


def health_check(address: str, port: int, timeout_s: float = 10.0,
                 ca_file: str | None = None) -> float:
    """A real MQTT CONNECT/CONNACK (over TLS, verifying the broker's certificate and name
    against `ca_file`, when one is given); returns the seconds it took, or raises
    BrokerError."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer"
    while time.monotonic() < deadline:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="perfpipe-health")
        if ca_file:
            client.tls_set(ca_certs=ca_file)
        started = time.monotonic()
        try:
            client.connect(address, port, keepalive=10)
            client.loop_start()
            for _ in range(100):
                if client.is_connected():
                    return time.monotonic() - started
                time.sleep(0.05)
            last_error = "no CONNACK within 5 s"
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            last_error = str(exc)
        finally:
            client.loop_stop()
            client.disconnect()
        time.sleep(0.2)
    raise BrokerError(f"broker at {address}:{port} did not accept an MQTT CONNECT: {last_error}")


def sys_messages(address: str, port: int, topics: tuple[str, ...], wait_s: float = 3.0,
                 first_only: bool = False) -> dict[str, str]:
    """topic -> payload of the $SYS messages seen within wait_s ({} when none or unreachable)."""
    seen: dict[str, str] = {}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="perfpipe-sys",
                         protocol=mqtt.MQTTv311)
    client.on_connect = lambda c, *_: [c.subscribe(t) for t in topics]
    client.on_message = lambda c, u, m: seen.setdefault(m.topic, m.payload.decode(errors="replace"))
    try:
        client.connect(address, port, keepalive=10)
        client.loop_start()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not (first_only and seen):
            time.sleep(0.05)
    except OSError:
        return {}
    finally:
        client.loop_stop()
        client.disconnect()
    return seen


def version_number(text: str) -> str | None:
    match = re.search(r"(\d+\.\d+[\w.-]*)", text or "")
    return match.group(1) if match else None


def sys_version(address: str, port: int, timeout_s: float = 3.0,
                topics: tuple[str, ...] = ("$SYS/broker/version",)) -> str:
    """The version a broker announces under $SYS (Mosquitto on $SYS/broker/version), or
    "unknown"."""
    seen = sys_messages(address, port, topics, wait_s=timeout_s, first_only=True)
    found = [v for v in map(version_number, seen.values()) if v]
    return found[0] if found else "unknown"


class Mosquitto:
    kind = "mosquitto"

    def __init__(self, host: Host) -> None:
        self.host = host

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
              tls_names: list[str] | None = None, local_dir: Path | None = None) -> dict:
        """Write the config, start the broker detached, wait until it answers CONNECT (and,
        with `tls_port`, a CONNECT over TLS that verifies the generated certificate)."""
        conf = f"{run_dir}/broker/mosquitto.conf"
        log = f"{run_dir}/broker/mosquitto.log"
        self.host.mkdir(f"{run_dir}/broker")
        tls = None
        if tls_port:
            if local_dir is None:
                raise ValueError("a TLS listener needs local_dir for its CA")
            tls = {"port": tls_port, **self.install_tls(run_dir, local_dir,
                                                        tls_names or [address])}
        local_conf = Path("/tmp") / f"perfpipe-mosquitto-{port}.conf"
        local_conf.write_text(render_config(port, bind_address(address), tls))
        self.host.put(local_conf, conf)
        local_conf.unlink()
        group = self.host.launch([self.binary(), "-c", conf], log)
        try:
            health_check(address, port)
            if tls:
                health_check(address, tls_port, ca_file=tls["local_ca"])
        except BrokerError as exc:
            self.host.kill_group(group)
            tail = self.host.run(["tail", "-n", "5", log], check=False).stdout.strip()
            raise BrokerError(f"{self.host.name}: mosquitto did not come up ({exc}): "
                              f"{tail or 'no log output'}") from None
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
