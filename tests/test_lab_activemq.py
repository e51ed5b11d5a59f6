"""JVM heap of a JVM broker over SSH: ActiveMQ (Debian's package) on the lab broker host.

Tuning writes the instance options, the broker start reads the heap back from the running
JVM with jcmd, and restore puts the default back.
"""

from __future__ import annotations

import pytest

from tasks.brokers.activemq import ActiveMQ, heap_bytes
from tasks.catalog.inventory import connect, load_inventory
from tasks.cli import main as perfpipe
from tests.lab import INVENTORY

pytestmark = pytest.mark.xdist_group("lab")


def start_and_read_heap(host, run_dir: str) -> dict[str, int]:
    adapter = ActiveMQ(host)
    port = host.free_port()
    state = adapter.start(run_dir, "10.250.77.11", port)
    try:
        return state["jvm_heap"]
    finally:
        adapter.stop(state["group_pid"])


def test_activemq_heap_is_applied_verified_on_the_jvm_and_restored(lab, perfpipe_env, capsys):
    inventory = load_inventory(INVENTORY)
    host = connect(inventory, "broker1", work_root="/tmp")
    tune = ["tune", "--inventory", str(INVENTORY), "--host", "broker1", "--profile", "activemq-heap"]

    assert perfpipe([*tune, "--apply"]) == 0
    assert "jvm_heap" in capsys.readouterr().out
    heap = start_and_read_heap(host, "/var/tmp/perfpipe/test-activemq-1")
    assert heap == {"InitialHeapSize": heap_bytes("-Xms256M"), "MaxHeapSize": heap_bytes("-Xmx256M")}

    assert perfpipe(["tune", "--inventory", str(INVENTORY), "--host", "broker1", "--restore"]) == 0
    capsys.readouterr()
    assert host.read_file("/etc/activemq/instances-available/perfpipe/options") is None
    heap = start_and_read_heap(host, "/var/tmp/perfpipe/test-activemq-2")
    assert heap["MaxHeapSize"] == heap_bytes("-Xmx512M")  # the package default is back
