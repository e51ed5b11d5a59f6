"""A broker TLS certificate signed by a throwaway CA, for a broker perfpipe does not manage.

    python -m tasks.brokers.certs --out DIR --name mosquitto [--name HOST ...]
                                  [--owner UID] [--days 365] [--ca-out CA_DIR]

perfpipe makes a CA per run when it starts the broker itself (`tasks.steps.broker`). A broker
started by someone else, e.g. the Mosquitto of docker-compose.yml, needs its certificate
before it starts, and the driver hosts need the CA where the TLS scenarios look for it
(``tls.ca_file``: ``.../perfpipe-ca.pem``). This writes, into DIR: ``ca.pem`` and the same CA
as ``perfpipe-ca.pem``, ``server.pem`` (subjectAltName: every --name) and ``server.key``
(mode 0600, owned by --owner: the uid the broker drops to). The CA's private key is never
written, so nothing else can be signed with it. With --ca-out, ``perfpipe-ca.pem`` is also
copied into CA_DIR: a folder for the driver hosts that holds no server key.

Idempotent: files that are there, cover every --name and stay valid for another day are
kept, so a broker already running with them and drivers holding the CA still agree.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
from pathlib import Path

from .tls import (
    CA_FILE,
    CERT_FILE,
    GENERATED_CA,
    KEY_FILE,
    make_certificates,
    subject_alt_name,
)


def still_good(out_dir: Path, names: list[str], margin: datetime.timedelta) -> bool:
    """Whether out_dir holds a CA (twice, the same), a server certificate it signed for
    every name, valid for at least `margin` more, and that certificate's key."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    files = [out_dir / f for f in (CA_FILE, GENERATED_CA, CERT_FILE, KEY_FILE)]
    if not all(f.is_file() and f.stat().st_size for f in files):
        return False
    ca_pem = (out_dir / CA_FILE).read_bytes()
    if (out_dir / GENERATED_CA).read_bytes() != ca_pem:
        return False
    cert = x509.load_pem_x509_certificate((out_dir / CERT_FILE).read_bytes())
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (InvalidSignature, ValueError, TypeError):
        return False
    key = load_pem_private_key((out_dir / KEY_FILE).read_bytes(), password=None)
    if key.public_key() != cert.public_key():
        return False
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc - now < margin:
        return False
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return all(subject_alt_name(name) in alt for name in names)


def write_certificates(out_dir: Path, names: list[str], days: int, owner: int | None,
                       ca_dir: Path | None = None) -> bool:
    """Make the files unless they are still good, and copy the CA into `ca_dir` (when
    given) unless it is there already; returns whether new ones were made."""
    made = _write_server_files(out_dir, names, days, owner)
    if ca_dir is not None:
        ca = out_dir / GENERATED_CA
        copy = ca_dir / GENERATED_CA
        if not copy.is_file() or copy.read_bytes() != ca.read_bytes():
            ca_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ca, copy)
    return made


def _write_server_files(out_dir: Path, names: list[str], days: int, owner: int | None) -> bool:
    if still_good(out_dir, names, datetime.timedelta(days=1)):
        return False
    made = make_certificates(out_dir, names, days=days)
    key = out_dir / KEY_FILE
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(made["key_pem"])
    os.chmod(key, 0o600)
    if owner is not None:
        os.chown(key, owner, -1)
    shutil.copyfile(made["ca"], out_dir / GENERATED_CA)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.brokers.certs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the files")
    parser.add_argument("--name", action="append", required=True,
                        help="a DNS name or IP address clients use for the broker (repeat)")
    parser.add_argument("--owner", type=int, default=None,
                        help="uid that must read server.key (the broker's user, e.g. 1883)")
    parser.add_argument("--days", type=int, default=365, help="validity (default 365)")
    parser.add_argument("--ca-out", type=Path, default=None,
                        help="a folder for the driver hosts: the CA only, no server key")
    args = parser.parse_args(argv)
    if args.days < 2:
        parser.error("--days: at least 2 (files valid for less than a day are replaced)")
    made = write_certificates(args.out, args.name, args.days, args.owner, args.ca_out)
    print(f"{'wrote' if made else 'kept'} {args.out / CA_FILE}, {args.out / GENERATED_CA}, "
          f"{args.out / CERT_FILE}, {args.out / KEY_FILE} for {', '.join(args.name)}"
          + (f"; the CA in {args.ca_out / GENERATED_CA}" if args.ca_out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
