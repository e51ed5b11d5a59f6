"""One fingerprint hash: the host hash the report shows is the one run fingerprints (what
comparisons key on) are built from, for a host provisioned for real."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from tasks import fingerprint
from tasks.catalog.inventory import load_inventory
from tasks.fingerprint import fingerprint_hash, run_hash
from tasks.hosts import LocalHost
from tasks.steps import provision
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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to leave one out")
def test_procs_auto_counts_the_cpus_a_hosts_processes_may_use_not_the_hosts(tmp_path):
    """A host reached over SSH may let perfpipe's processes run on fewer CPUs than it has (a
    cpuset, a container, sshd under taskset): its fingerprint records both, and procs: auto
    starts one driver process per CPU they may use. The probe runs for real, from a process
    kept on one CPU."""
    mine, host = os.sched_getaffinity(0), LocalHost()
    os.sched_setaffinity(0, {min(mine)})
    try:
        facts = provision.fingerprint(host, host.code_root)
    finally:
        os.sched_setaffinity(0, mine)
    assert facts["usable_cpus"] == 1 < facts["cpus"] == os.cpu_count()
    assert "usable_cpus" not in fingerprint.host_facts(facts)  # the host's hash is as before

    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "d1.json").write_text(json.dumps(facts))
    (hosts / "d2.json").write_text(json.dumps({"cpus": 4}))  # a run folder from before
    ctx = SimpleNamespace(run_dir=tmp_path)
    assert provision.usable_cpus(ctx) == {"d1": 1, "d2": 4}
    assert provision.host_cpus(ctx) == {"d1": os.cpu_count(), "d2": 4}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts:\n" + "".join(
        f"  - {{name: {h}, address: 192.0.2.1, transport: ssh, roles: [driver], procs: auto}}\n"
        for h in ("d1", "d2")) + "broker: {managed: false, address: 192.0.2.9, port: 1883}\n")
    assert load_inventory(inventory).driver_procs(provision.usable_cpus(ctx)) == [
        ("d1", 1), ("d2", 4)]
