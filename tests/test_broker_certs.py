"""python -m tasks.brokers.certs: files for a broker perfpipe does not start, kept while
they still hold together, replaced when they do not."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from tasks.brokers.certs import main


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_written_once_then_kept(tmp_path: Path, capsys):
    out = tmp_path / "certs"
    assert main(["--out", str(out), "--name", "mosquitto", "--owner", "0"]) == 0
    first = files(out)
    assert set(first) == {"ca.pem", "perfpipe-ca.pem", "server.pem", "server.key"}
    assert first["ca.pem"] == first["perfpipe-ca.pem"]
    assert stat.S_IMODE((out / "server.key").stat().st_mode) == 0o600
    assert main(["--out", str(out), "--name", "mosquitto"]) == 0
    assert files(out) == first
    assert capsys.readouterr().out.splitlines()[-1].startswith("kept ")


def test_replaced_for_a_new_name_a_foreign_ca_or_a_foreign_key(tmp_path: Path):
    out, other = tmp_path / "certs", tmp_path / "other"
    main(["--out", str(other), "--name", "mosquitto"])
    main(["--out", str(out), "--name", "mosquitto"])
    before = files(out)
    main(["--out", str(out), "--name", "mosquitto", "--name", "10.0.0.7"])
    assert files(out)["server.pem"] != before["server.pem"]  # the new name needs a new cert
    for name in ("ca.pem", "server.key"):  # not what signed / belongs to server.pem
        shutil.copy(other / name, out / name)
        shutil.copy(out / "ca.pem", out / "perfpipe-ca.pem")
        main(["--out", str(out), "--name", "mosquitto"])
        assert (out / name).read_bytes() != (other / name).read_bytes(), name


def test_too_short_a_validity_is_refused(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--out", str(tmp_path), "--name", "mosquitto", "--days", "1"])
    assert exited.value.code == 2
    assert "--days: at least 2" in capsys.readouterr().err
