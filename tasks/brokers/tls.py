"""Throwaway TLS material for a broker under test: a CA whose key is never written, and a
server certificate it signs (RSA 2048, as the MessageSight CONNBURST.SEC test)."""

from __future__ import annotations

import datetime
import ipaddress
import posixpath
from collections.abc import Iterable
from pathlib import Path

from .errors import BrokerError

CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "server.pem", "server.key"
GENERATED_CA = "perfpipe-ca.pem"  # a tls.ca_file with this name gets perfpipe's generated CA


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


def tls_listener(stages: Iterable, kind: str, supports_tls: bool = True) -> dict | None:
    """{port, ca_files} of the one TLS listener a managed broker of `kind` opens for the
    planned `stages` (`tasks.catalog.stages.Stage`), or None; BrokerError for stages it
    cannot serve (checked when a run is planned, and at the broker step)."""
    ports, ca_files = set(), set()
    for stage in stages:
        tls = (stage.connection or {}).get("tls")
        if tls is None:
            continue
        if not tls.get("port"):
            raise BrokerError(f"stage {stage.stage_id}: connection.tls needs port: (the broker's "
                              f"TLS listener, e.g. 8883); the default is the plain port")
        ports.add(tls["port"])
        if tls.get("ca_file") and posixpath.basename(tls["ca_file"]) == GENERATED_CA:
            ca_files.add(tls["ca_file"])
    if len(ports) > 1:
        raise BrokerError(f"the planned TLS stages use ports {sorted(ports)}; perfpipe opens one "
                          f"TLS listener, so give every connection.tls the same port")
    if ports and not supports_tls:
        raise BrokerError(f"{kind}: perfpipe cannot give it a TLS listener; leave the TLS "
                          "scenarios out of the suite")
    return {"port": ports.pop(), "ca_files": sorted(ca_files)} if ports else None
