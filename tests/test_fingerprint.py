"""One fingerprint hash: the host hash the report shows is the one run fingerprints (what
comparisons key on) are built from, for a host provisioned for real."""

from __future__ import annotations

import json

from tasks import fingerprint
from tasks.fingerprint import fingerprint_hash, run_hash
from tasks.steps.provision import run_fingerprint
from tasks.steps.report import render_stored
from tests.conftest import unmanaged_run


def test_the_host_hash_the_report_shows_is_the_one_comparisons_key_on(tiny_suite, broker,
                                                                       tmp_path, monkeypatch):
    ctx = unmanaged_run(tmp_path, broker.port, "tiny")

    written = json.loads((ctx.run_dir / "hosts" / "localhost.json").read_text())
    (stored,) = ctx.store().fingerprints(ctx.run_id)
    assert stored["hash"] == written["hash"]  # the store and provisioning agree
    html = render_stored(ctx.store(), ctx.run_id, ctx.run_dir)
    assert f">{stored['hash']}<" in html  # the report shows it
    # and the run fingerprint that stages are compared by is built from that same hash
    assert run_fingerprint(ctx) == run_hash([stored["hash"]], [], "mosquitto")

    # perfpipe's measurement version, as provisioning recorded it with the driver it
    # shipped: 1 keeps the fingerprints recorded before it existed (hosts, tuning and
    # broker kind only), and so does a run folder of a perfpipe that did not record it
    assert written["measurement_version"] == fingerprint.MEASUREMENT_VERSION
    before = fingerprint_hash([[stored["hash"]], [], "mosquitto"])
    host_file = ctx.run_dir / "hosts" / "localhost.json"
    host_file.write_text(json.dumps({**written, "measurement_version": 1}))
    assert run_fingerprint(ctx) == before
    host_file.write_text(json.dumps({**written, "measurement_version": 2}))
    assert run_fingerprint(ctx) == run_hash([stored["hash"]], [], "mosquitto", measurement=2)
    assert run_fingerprint(ctx) != before
    monkeypatch.setattr(fingerprint, "MEASUREMENT_VERSION", 3)  # a later perfpipe loading it
    assert run_fingerprint(ctx) == run_hash([stored["hash"]], [], "mosquitto", measurement=2)
    host_file.write_text(json.dumps({k: v for k, v in written.items()
                                     if k != "measurement_version"}))
    assert run_fingerprint(ctx) == before


def test_the_broker_kept_on_its_cpus_is_another_fingerprint_and_none_is_as_before():
    plain = run_hash(["h"], ["t"], "mosquitto")
    assert run_hash(["h"], ["t"], "mosquitto", broker_cpus=None) == plain
    assert run_hash(["h"], ["t"], "mosquitto", broker_cpus="0") not in (
        plain, run_hash(["h"], ["t"], "mosquitto", broker_cpus="1"))
