"""Tuning over real SSH on the lab hosts: check, apply, read back, restore, and failures.

Only network-namespaced sysctls are applied (the lab inventory's tuning_allow); the global
fs.file-max of the lab-net profile is exercised in check mode only. Limits and the pids
cgroup are per lab host (its own mount namespace and cgroup subtree).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tasks.catalog.inventory import connect, load_inventory
from tasks.cli import main as perfpipe
from tasks.hosts import SSH_DEAD_AFTER_S, SshHost
from tests.lab import INVENTORY, STATE

pytestmark = pytest.mark.xdist_group("lab")

NAMESPACED = ["net.ipv4.ip_local_port_range", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_rmem",
              "net.core.somaxconn"]


def sysctl_here(key: str) -> str:
    return " ".join(Path("/proc/sys", key.replace(".", "/")).read_text().split())


def host_state(host: SshHost) -> dict:
    """What the profile touches on a lab host, read over SSH."""
    values = {key: " ".join(host.run(["cat", "/proc/sys/" + key.replace(".", "/")]).stdout.split())
              for key in NAMESPACED}
    values["sysctl.d"] = host.run(["ls", "/etc/sysctl.d"]).stdout.split()
    values["limits.d"] = host.run(["ls", "/etc/security/limits.d"]).stdout.split()
    values["cgroups"] = host.run(["ls", "/sys/fs/cgroup/pids"]).stdout.split()
    values["nofile"] = host.fresh().run(["sh", "-c", "ulimit -Sn"]).stdout.strip()
    return values


def lab_hosts() -> list[SshHost]:
    inventory = load_inventory(INVENTORY)
    return [connect(inventory, h.name, work_root="/tmp") for h in inventory.hosts]


def tune(mode: str, capsys, *extra: str) -> tuple[int, str, str]:
    code = perfpipe(["tune", "--inventory", str(INVENTORY), f"--{mode}", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def rows(output: str) -> list[list[str]]:
    """The table's rows (its columns two spaces apart), not the notes under it."""
    return [line.split() for line in output.splitlines()
            if line.startswith(("broker1  ", "driver1  ", "driver2  "))]


def notes(output: str) -> list[str]:
    """The lines under the table: a host, a value's kind and key, its note."""
    return [line for line in output.splitlines()
            if line[:8] in ("broker1 ", "driver1 ", "driver2 ") and line[8:9] != " "]


def driver1_tuned(tmp_path: Path, also: str | None = None) -> tuple[Path, SshHost, dict]:
    """An inventory of driver1 (and the host `also`: 'name, address: ...'), tuned to apply
    and restore the lab-net profile, applied on driver1 with `perfpipe tune`: (inventory,
    driver1, its state before)."""
    common = (f"user: root, key_file: {STATE / 'client_key'}, transport: ssh, roles: "
              "[driver], python: /usr/bin/python3, tuning_allow: ['net.*']")
    hosts = "".join(f"  - {{name: {entry}, {common}}}\n"
                    for entry in ["driver1, address: 10.250.77.12", *filter(None, [also])])
    inventory = tmp_path / "driver1.yml"
    inventory.write_text(f"hosts:\n{hosts}broker: {{host: driver1, managed: false, port: 1883}}\n"
                         "tuning_profile: lab-net\ntuning_mode: apply\ntuning_restore: true\n")
    driver1 = next(h for h in lab_hosts() if h.name == "driver1")
    before = host_state(driver1)
    assert perfpipe(["tune", "--inventory", str(inventory), "--apply", "--host", "driver1"]) == 0
    return inventory, driver1, before


@pytest.mark.slow  # about 13 s
def test_check_apply_again_and_restore_over_ssh(lab, perfpipe_env, capsys):
    here = {key: sysctl_here(key) for key in NAMESPACED + ["fs.file-max"]}
    before = {h.name: host_state(h) for h in lab_hosts()}

    code, out, err = tune("check", capsys)
    assert code == 0 and all(r[-1] in ("check-only", "unchanged") for r in rows(out)), out + err
    assert {h.name: host_state(h) for h in lab_hosts()} == before  # check changes nothing

    code, out, _ = tune("apply", capsys)
    assert code == 0, out
    applied = rows(out)
    assert sum(r[-1] == "applied" for r in applied) == 3 * 7  # 4 sysctls, 2 limits, TasksMax
    assert all(r[-1] == "not-allowed" for r in applied if r[2] == "fs.file-max")
    for host in lab_hosts():
        state = host_state(host)
        assert state["net.core.somaxconn"] == "8192"
        assert state["net.ipv4.ip_local_port_range"] == "5000 65000"
        assert state["nofile"] == "16384"  # PAM applied the limits.d drop-in at a fresh login
        assert "90-perfpipe.conf" in state["sysctl.d"] and "perfpipe-user-0" in state["cgroups"]
    assert {key: sysctl_here(key) for key in here} == here  # this machine is untouched

    code, out, _ = tune("apply", capsys)
    assert code == 0 and not any(r[-1] == "applied" for r in rows(out))  # nothing left to do

    code, out, _ = tune("restore", capsys)
    assert code == 0, out
    assert {h.name: host_state(h) for h in lab_hosts()} == before
    assert {key: sysctl_here(key) for key in here} == here


def test_an_apply_killed_midway_leaves_every_before_value_it_changed(lab, perfpipe_env, capsys):
    """Fault: `perfpipe tune --apply` killed with SIGKILL right after its first change on a
    lab host. What it changed must be restorable from what it left on disk."""
    import json
    import os
    import signal
    import sys

    before = {h.name: host_state(h) for h in lab_hosts()}
    watched = lab_hosts()[1]
    paths = ["/proc/sys/" + key.replace(".", "/") for key in NAMESPACED]
    first = watched.run(["cat", *paths]).stdout
    apply = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli", "tune", "--inventory", str(INVENTORY), "--apply"],
        env={**os.environ, "PERFPIPE_STATE_DIR": str(perfpipe_env)}, cwd=INVENTORY.parents[2],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and watched.run(["cat", *paths]).stdout == first:
        time.sleep(0.02)
    apply.send_signal(signal.SIGKILL)
    assert apply.wait() == -signal.SIGKILL, "the apply ended before it was killed"

    for host in lab_hosts():
        now = host_state(host)
        record = perfpipe_env / "tuning" / f"{host.name}.json"
        undo = json.loads(record.read_text())["records"] if record.exists() else []
        sysctls = {r["key"]: r["before"] for r in undo if r["kind"] == "sysctl"}
        for key in NAMESPACED:
            if now[key] != before[host.name][key]:
                assert " ".join(sysctls[key].split()) == before[host.name][key], (host.name, key)
        files = {r["key"] for r in undo if r["kind"] == "file"}
        for folder, listed in (("/etc/sysctl.d", "sysctl.d"), ("/etc/security/limits.d",
                                                               "limits.d")):
            for name in set(now[listed]) - set(before[host.name][listed]):
                assert f"{folder}/{name}" in files, (host.name, name)
    assert any(now != before[h.name] for h in lab_hosts() for now in [host_state(h)])

    code, out, _ = tune("restore", capsys)
    assert code == 0, out
    assert {h.name: host_state(h) for h in lab_hosts()} == before


def test_teardown_restores_a_partly_tuned_host_and_names_one_it_cannot_reach(
        lab, tiny_suite, tmp_path, capsys):
    """Fault: a run's tune step changed driver1 and failed before it recorded the run's
    tuning (here: the changes made by `tune --apply --host driver1`, no tuning/ file in the
    run), and host ghost, which has an undo record, cannot be reached at teardown. Teardown
    restores driver1 from its undo record, names ghost and keeps its record."""
    import json

    from tasks.run_context import RunContext
    from tasks.settings import load_settings
    from tasks.steps.plan import plan_run
    from tasks.steps.tune import restore_run_tuning
    from tasks.tuning.runner import snapshot_path

    inventory, driver1, before = driver1_tuned(tmp_path, also="ghost, address: 10.250.77.99")
    assert host_state(driver1) != before
    settings = load_settings()
    ghost = snapshot_path(settings.state_dir, "ghost")
    ghost.write_text(json.dumps({"profile": "lab-net", "records": [
        {"kind": "sysctl", "key": "net.core.somaxconn", "before": "4096"}]}))
    ctx = RunContext.load(settings, plan_run(settings, suite="tiny", inventory=inventory))
    assert not (ctx.run_dir / "tuning").exists()  # the run's tune step recorded nothing

    problems: list[str] = []
    restored = restore_run_tuning(ctx, problems)
    assert restored["driver1"] > 0 and "ghost" not in restored
    assert host_state(driver1) == before
    assert not snapshot_path(settings.state_dir, "driver1").exists()
    (line,) = problems
    assert line.startswith("tuning not restored on ghost (its record is kept for "
                           "`perfpipe tune --restore`): "), line
    assert ghost.exists()
    capsys.readouterr()


def test_unreachable_wrong_key_and_no_sudo_each_get_one_line(lab, perfpipe_env, tmp_path, capsys):
    key = tmp_path / "not_authorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    client_key = STATE / "client_key"
    common = "transport: ssh, roles: [driver], python: /usr/bin/python3, tuning_allow: ['net.*']"
    inventory = tmp_path / "mixed.yml"
    inventory.write_text(f"""
hosts:
  - {{name: driver1, address: 10.250.77.12, user: root, key_file: {client_key}, {common}}}
  - {{name: ghost, address: 10.250.77.99, user: root, key_file: {client_key}, {common}}}
  - {{name: wrongkey, address: 10.250.77.12, user: root, key_file: {key}, {common}}}
  - {{name: nosudo, address: 10.250.77.13, user: pplab, key_file: {client_key}, {common}}}
broker: {{host: driver1, managed: false, port: 1883}}
""")
    code = perfpipe(["tune", "--inventory", str(inventory), "--profile", "lab-net", "--apply"])
    out = capsys.readouterr()
    assert code == 1
    errors = out.err.strip().splitlines()
    assert len(errors) == 3
    assert any(line.startswith("ghost: ERROR") and "unreachable" in line for line in errors)
    assert any(line.startswith("wrongkey: ERROR") and "key refused" in line for line in errors)
    assert any(line.startswith("nosudo: ERROR") and "cannot run commands as root" in line
               for line in errors)
    assert sum(r[0] == "driver1" and r[-1] == "applied" for r in rows(out.out)) == 7
    assert perfpipe(["tune", "--inventory", str(inventory), "--restore", "--host", "driver1"]) == 0
    capsys.readouterr()


def test_shell_metacharacters_are_never_executed(lab, tmp_path):
    markers = [Path(f"/tmp/perfpipe-pwned-{i}") for i in range(5)]
    for marker in markers:
        marker.unlink(missing_ok=True)
    payloads = [f"$(touch {markers[0]})", f"`touch {markers[1]}`", f"; touch {markers[2]}",
                f"| touch {markers[3]}", f"&& touch {markers[4]}"]
    host = lab_hosts()[1]
    out = host.run(["printf", "%s\\n", *payloads]).stdout.splitlines()
    assert out == payloads
    log = f"/tmp/perfpipe-launch-{tmp_path.name}.log"
    group = host.launch(["printf", "%s\\n", *payloads], log)
    for _ in range(50):
        if host.exit_code(log) is not None:
            break
        time.sleep(0.1)
    assert host.read_file(log).splitlines() == payloads and group > 0
    assert not any(marker.exists() for marker in markers)


@pytest.mark.parametrize("document, field", [
    ({"name": "p", "sysctl": {"net.core.somaxconn; reboot": "1"}}, "sysctl"),
    ({"name": "p", "sysctl": {"net.core.somaxconn": "1; reboot"}}, "sysctl"),
    ({"name": "p", "sysctl": {"net.core.somaxconn": "$(reboot)"}}, "sysctl"),
    ({"name": "p", "limits": [{"domain": "root;reboot", "type": "soft", "item": "nofile",
                               "value": "1"}]}, "limits.0.domain"),
    ({"name": "p", "limits": [{"domain": "root", "type": "soft", "item": "nofile",
                               "value": "1 `reboot`"}]}, "limits.0.value"),
    ({"name": "p", "tasks_max": {"user": "mqm$(reboot)", "value": 5}}, "tasks_max.user"),
    ({"name": "p", "qm_ini": {"path": "/var/mqm/qm.ini;reboot", "stanzas": {}}}, "qm_ini.path"),
    ({"name": "p;reboot"}, "name"),
    # values a host would refuse: a JVM that does not start, qm.ini lines added anew on every
    # apply (a name its syntax does not read back) or of their own (a line break)
    ({"name": "p", "jvm_heap": {"service": "activemq", "xms": "8G", "xmx": "1G"}}, "jvm_heap"),
    ({"name": "p", "qm_ini": {"path": "/q/qm.ini", "stanzas": {"Tuning Parameters": {}}}},
     "qm_ini.stanzas"),
    ({"name": "p", "qm_ini": {"path": "/q/qm.ini",
                              "stanzas": {"Channels": {"MaxChannels": "5\nMaxActive=1"}}}},
     "qm_ini.stanzas"),
])
def test_profile_fields_reject_shell_metacharacters_and_what_a_host_would_refuse(
        document, field):
    from tasks.config_files import ConfigError, validate
    from tasks.tuning.profile import TuningProfile

    with pytest.raises(ConfigError, match=f"x.yml: {field}"):
        validate(TuningProfile, document, "x.yml")


@pytest.mark.parametrize("host_fields, field", [
    ({"name": "a;b"}, "hosts.0.name"),
    ({"user": "root$(id)"}, "hosts.0.user"),
    ({"code_root": "/opt/$(id)"}, "hosts.0.code_root"),
    ({"work_root": "relative/dir"}, "hosts.0.work_root"),
])
def test_inventory_fields_reject_shell_metacharacters(host_fields, field):
    from tasks.catalog.inventory import Inventory
    from tasks.config_files import ConfigError, validate

    host = {"name": "h", "roles": ["driver", "broker"], **host_fields}
    document = {"hosts": [host], "broker": {"host": host["name"]}}
    with pytest.raises(ConfigError, match=f"inv.yml: {field}"):
        validate(Inventory, document, "inv.yml")


def test_ssh_key_from_an_airflow_connection_never_lands_on_disk(lab, perfpipe_env, tmp_path,
                                                               monkeypatch, capsys):
    import json

    private_key = (STATE / "client_key").read_text()
    host_key = (STATE / "hosts" / "driver1" / "host_key.pub").read_text().split()
    other_key = (STATE / "hosts" / "driver2" / "host_key.pub").read_text().split()

    def connection(**extra) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_LAB_DRIVER1", json.dumps({
            "conn_type": "ssh", "host": "10.250.77.12", "login": "root",
            "extra": {"private_key": private_key, **extra}}))

    inventory = tmp_path / "conn.yml"
    inventory.write_text(
        "hosts: [{name: driver1, transport: ssh, ssh_conn_id: perfpipe_lab_driver1, "
        "roles: [driver, broker], python: /usr/bin/python3, tuning_allow: []}]\n"
        "broker: {host: driver1}\ntuning_profile: lab-net\n")
    # as the SSH provider checks a host: the Connection's host_key, else known_hosts
    for refused in ({"host_key": " ".join(other_key[:2])}, {}):  # another host's; none known
        connection(**refused)
        assert perfpipe(["tune", "--inventory", str(inventory), "--check"]) != 0
        out = capsys.readouterr()
        assert "10.250.77.12" in out.err and ("not found in known_hosts" in out.err
                                              or "does not match" in out.err), out.err
    connection(host_key=" ".join(host_key[:2]))
    code = perfpipe(["tune", "--inventory", str(inventory), "--check"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert len(rows(out.out)) == 8  # every value of lab-net read back over SSH
    body = "".join(private_key.splitlines()[1:-1])
    for path in perfpipe_env.rglob("*"):
        if path.is_file():
            assert body[:40] not in path.read_text(errors="ignore")
    assert body[:40] not in out.out + out.err


def bastion_inventory(path: Path, *, innermost: bool = False) -> Path:
    """driver1 as a bastion, driver2 (`inner`) reached only through it and, with
    `innermost`, broker1 reached only through `inner`."""
    common = f"transport: ssh, user: root, key_file: {STATE / 'client_key'}, python: /usr/bin/python3"
    third = (f"  - {{name: innermost, address: 10.250.77.11, gateway: inner, roles: [driver], "
             f"{common}}}\n" if innermost else "")
    path.write_text(f"""
hosts:
  - {{name: bastion, address: 10.250.77.12, roles: [broker], {common}}}
  - {{name: inner, address: 10.250.77.13, gateway: bastion, roles: [driver], {common}}}
{third}broker: {{host: bastion}}
""")
    return path


def test_a_host_behind_a_gateway_is_reached_through_it(lab, perfpipe_env, tmp_path, capsys):
    inventory = bastion_inventory(tmp_path / "bastion.yml")
    host = connect(load_inventory(inventory), "inner", work_root="/tmp")
    assert host.run(["hostname"]).stdout.strip() == "driver2"
    client_ip = host.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0]
    assert client_ip == "10.250.77.12"  # the session came from the bastion, not from here
    host.close()
    code = perfpipe(["tune", "--inventory", str(inventory), "--profile", "lab-net", "--check",
                     "--host", "inner"])
    assert code == 0 and len(rows(capsys.readouterr().out.replace("inner ", "driver2 "))) == 8


def test_ssh_connections_and_their_gateways_have_no_nagle_delay_and_the_dead_link_deadline(
        lab, tmp_path):
    """Every TCP connection perfpipe's SSH runs over, to a host or to a gateway (here two,
    one behind the other): no Nagle delay (each command is a few small SSH messages: with
    it, ~40 ms a command waits on the server's delayed ACK), keepalives, and the kernel's
    deadline for unanswered bytes (`SSH_DEAD_AFTER_S`). Closing a host closes them all."""
    inventory = load_inventory(bastion_inventory(tmp_path / "bastion.yml", innermost=True))
    hosts = [connect(inventory, name, work_root="/tmp") for name in ("bastion", "innermost")]
    try:
        assert hosts[0].run(["hostname"]).stdout.strip() == "driver1"
        assert hosts[1].run(["hostname"]).stdout.strip() == "broker1"  # through both
        hops = [hosts[0]._connection, hosts[1]._connection.gateway.gateway]
        assert all(hop.transport.sock.getpeername()[0] == "10.250.77.12" for hop in hops)
        for sock in (hop.transport.sock for hop in hops):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == \
                SSH_DEAD_AFTER_S * 1000
    finally:
        for host in hosts:
            host.close()
    chain = [hosts[1]._connection, hosts[1]._connection.gateway, hops[1]]
    assert not any(hop.is_connected for hop in [hops[0], *chain])  # gateways' closed too


def test_a_qm_ini_is_tuned_read_back_and_put_back_exactly(lab, perfpipe_env, tmp_path):
    """IBM MQ cannot run here; its qm.ini is a file, edited over SSH on a lab host as on a
    queue manager's: the stanza's key set and read back, then the file as it was, and no
    file of perfpipe's left beside it."""
    from tasks.tuning import runner
    from tasks.tuning.profile import TuningProfile

    folder = tmp_path / "QM1"  # this machine's /tmp: the lab hosts see it
    folder.mkdir()
    qm_ini = folder / "qm.ini"
    original = "Log:\n   LogPrimaryFiles=3\nTuningParameters:\n   MaxChannels=100\n"
    qm_ini.write_text(original)
    host = lab_hosts()[0]
    profile = TuningProfile(name="qm", qm_ini={"path": str(qm_ini), "stanzas": {
        "TuningParameters": {"MaxChannels": "5000"}, "Channels": {"MaxActiveChannels": "5000"}}})
    entries = runner.tune(host, profile, mode="apply", allow=[], state_dir=perfpipe_env)
    assert [(e.key, e.before, e.after, e.ok) for e in entries] == [
        ("TuningParameters/MaxChannels", "100", "5000", True),
        ("Channels/MaxActiveChannels", None, "5000", True)]
    assert "MaxChannels=5000" in qm_ini.read_text()
    restored = runner.restore(host, state_dir=perfpipe_env)
    assert [(e.key, e.after, e.ok) for e in restored] == [(str(qm_ini), "(restored)", True)]
    assert qm_ini.read_text() == original and sorted(folder.iterdir()) == [qm_ini]
    assert not runner.snapshot_path(perfpipe_env, host.name).exists()


@pytest.fixture
def systemd_host(lab):
    """broker1 as a host where systemd runs, as far as perfpipe's TasksMax can tell: in the
    lab host's own mount namespace, /run/systemd/system exists and systemctl is
    `tests/systemctl_standin.py` (a stand-in: systemd cannot run here), each on a tmpfs
    unmounted after the test, so this machine's own /run/systemd and systemctl are never
    touched. The stand-in loads the units once, as at boot."""
    host = lab_hosts()[0]
    standin = Path(__file__).with_name("systemctl_standin.py")

    def take_away() -> None:  # after the test, and before it: one killed midway left them
        for mounted in ("/usr/local/sbin", "/run/systemd"):
            if host.run(["mountpoint", "-q", mounted], check=False).ok:
                host.as_root(["umount", mounted])
        host.as_root(["rm", "-rf", "--", "/etc/systemd/system/user-0.slice.d"])

    take_away()
    try:
        host.as_root(["mount", "-t", "tmpfs", "pplab-systemd", "/run/systemd"])
        host.as_root(["mount", "-t", "tmpfs", "pplab-sbin", "/usr/local/sbin"])
        host.as_root(["mkdir", "/run/systemd/system"])
        host.put(standin, "/usr/local/sbin/systemctl")
        host.as_root(["chmod", "755", "/usr/local/sbin/systemctl"])
        assert host.run(["sh", "-c", "command -v systemctl"]).stdout.strip() == (
            "/usr/local/sbin/systemctl")
        host.as_root(["systemctl", "daemon-reload"])
        yield host
    finally:
        take_away()
        host.close()


def test_systemd_tasks_max_is_a_drop_in_of_its_own_that_restore_takes_away(
        systemd_host, perfpipe_env):
    """Where systemd runs, TasksMax is perfpipe's own drop-in, loaded by a daemon-reload and
    read back from systemd; restore removes it, and the folder it made, and reloads, so the
    unit is as its owner configured it (`systemctl set-property` would have left a
    50-TasksMax.conf pinning the old value). An owner's drop-in beside it stays, and its
    value is the one back."""
    from tasks.tuning import runner
    from tasks.tuning.profile import TuningProfile

    host, folder = systemd_host, "/etc/systemd/system/user-0.slice.d"
    profile = TuningProfile(name="tasks", tasks_max={"user": "root", "value": 65536})

    def loaded() -> str:
        return host.run(["systemctl", "show", "-p", "TasksMax", "--value",
                         "user-0.slice"]).stdout.strip()

    def listing() -> list[str]:
        return host.run(["sh", "-c", "ls -A /etc/systemd/system 2>/dev/null; ls -A "
                         f"{folder} 2>/dev/null || true"]).stdout.split()

    for owners in (None, "[Slice]\nTasksMax=4242\n"):
        if owners:
            host.as_root(["mkdir", "-p", folder])
            host.write_root_file(f"{folder}/10-owner.conf", owners)
            host.as_root(["systemctl", "daemon-reload"])
        before, files = loaded(), listing()
        entries = runner.tune(host, profile, mode="apply", allow=[], state_dir=perfpipe_env)
        assert [(e.before, e.after, e.action, e.note) for e in entries] == [
            (before, "65536", "applied", f"systemd: {folder}/90-perfpipe.conf")]
        assert host.read_root_file(f"{folder}/90-perfpipe.conf") == (
            "# written by perfpipe, profile tasks\n[Slice]\nTasksMax=65536\n")
        restored = runner.restore(host, state_dir=perfpipe_env)
        assert [(e.kind, e.after, e.ok) for e in restored] == [
            ("file", "(removed)", True), ("tasks_max", before, True)]
        assert (loaded(), listing()) == (before, files)
    assert before == "4242"


def test_tune_prints_each_value_s_note_the_mqxr_heap_commands_among_them(
        lab, perfpipe_env, tmp_path, monkeypatch, capsys):
    """IBM MQ cannot run here, and perfpipe does not set its MQXR heap: it gives the runmqsc
    commands that do. `perfpipe tune` prints them under its table, with every value's note:
    here TasksMax's, a cgroup of its own on a host without systemd, which limits no
    process, and says so."""
    (tmp_path / "mq.yml").write_text(
        "name: mq\njvm_heap: {service: mqxr, queue_manager: PERF0, xms: 4096M, xmx: 4096M}\n"
        "tasks_max: {user: root, value: 65536}\n")
    monkeypatch.setenv("PERFPIPE_TUNING_DIR", str(tmp_path))
    code, out, err = tune("check", capsys, "--profile", "mq", "--host", "broker1")
    assert code == 0, out + err
    said = notes(out)
    assert said[0].startswith("broker1 tasks_max root (/sys/fs/cgroup/pids/perfpipe-user-0/"
                               "pids.max): cgroup (no systemd): ") and "limits none" in said[0]
    assert said[1].startswith("broker1 jvm_heap mqxr -Xms: run with runmqsc PERF0: "
                               "STOP SERVICE(SYSTEM.MQXR.SERVICE) ; ALTER SERVICE(")
    assert '-J "-Xms4096M" -J "-Xmx4096M"' in said[1] and len(said) == 3, out


def test_a_nofile_limit_above_nr_open_is_refused_before_anything_is_written(
        lab, perfpipe_env):
    """pam_limits cannot set it, and PAM then refuses every login it applies to, ssh
    included: the host's owner and perfpipe's restore would be locked out."""
    from tasks.hosts import HostError
    from tasks.tuning import runner
    from tasks.tuning.profile import TuningProfile

    host = lab_hosts()[0]
    before = host_state(host)
    nr_open = int(host.run(["cat", "/proc/sys/fs/nr_open"]).stdout)
    profile = TuningProfile(name="too-many", limits=[
        {"domain": "root", "type": "soft", "item": "nofile", "value": "16384"},
        {"domain": "root", "type": "hard", "item": "nofile", "value": str(nr_open + 1)}])
    with pytest.raises(HostError, match=rf"nofile {nr_open + 1} for root is above fs.nr_open "
                                        rf"{nr_open} here: PAM would refuse its logins"):
        runner.tune(host, profile, mode="apply", allow=[], state_dir=perfpipe_env)
    assert host_state(host) == before  # no limits.d file, the login still works
    with pytest.raises(ValueError, match="nofile cannot be unlimited"):
        TuningProfile(name="x", limits=[{"domain": "*", "type": "-", "item": "nofile",
                                         "value": "unlimited"}])


def test_a_limit_for_everyone_is_read_as_the_root_logins_get_it(lab, perfpipe_env):
    """pam_limits applies `*` (and @group) lines to no root login, and perfpipe logs in as
    root here: the line was read back from the file and said "applied, ok" of a limit its
    own processes never got (messagesight-client's nofile 200000). What a root login gets
    is read, and said why it differs."""
    from tasks.tuning import runner
    from tasks.tuning.profile import TuningProfile

    host = lab_hosts()[0]
    before = host_state(host)
    profile = TuningProfile(name="everyone", limits=[
        {"domain": "*", "type": "soft", "item": "nofile", "value": "12345"}])
    try:
        (entry,) = runner.tune(host, profile, mode="apply", allow=[], state_dir=perfpipe_env)
        assert entry.action == "applied" and entry.after != "12345" and not entry.ok, entry
        assert "pam_limits applies * lines to no root login" in entry.note
    finally:
        runner.restore(host, state_dir=perfpipe_env)
    assert host_state(host) == before


def test_a_restore_that_does_not_put_a_value_back_keeps_its_record_and_fails(
        lab, perfpipe_env, capsys):
    """A value the kernel reads back otherwise than recorded (here a before-value with tabs,
    which /proc/sys gives back with spaces) is not restored: said, exit 1, and its record
    kept for the next restore instead of forgotten."""
    import json

    host = lab_hosts()[0]
    key = "net.ipv4.tcp_rmem"
    now = " ".join(host.run(["cat", "/proc/sys/net/ipv4/tcp_rmem"]).stdout.split())
    record = perfpipe_env / "tuning" / f"{host.name}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    kept = [{"kind": "sysctl", "key": key, "before": now.replace(" ", "\t")}]
    record.write_text(json.dumps({"profile": "lab-net", "records": kept}))
    code, out, _ = tune("restore", capsys, "--host", host.name)
    assert code == 1
    assert [r[-2:] for r in rows(out)] == [["NO", "restored"]]
    assert json.loads(record.read_text())["records"] == kept
    record.unlink()


def test_a_user_without_sudo_reads_what_is_not_there_as_missing(lab, tmp_path):
    """`perfpipe tune --check` as a login user without sudo: a path not there is missing
    (the cgroup a TasksMax apply would make, a folder and all), one it may not read is an
    error naming it, never taken for missing."""
    from tasks.hosts import HostError

    inventory = tmp_path / "nosudo.yml"
    inventory.write_text(f"""
hosts:
  - {{name: nosudo, address: 10.250.77.13, user: pplab, key_file: {STATE / "client_key"},
     transport: ssh, roles: [driver], python: /usr/bin/python3}}
broker: {{host: nosudo, managed: false, port: 1883}}
""")
    host = connect(load_inventory(inventory), "nosudo", work_root="/tmp")
    assert host.read_root_file("/sys/fs/cgroup/pids/perfpipe-user-9999/pids.max") is None
    assert host.read_root_file("/proc/sys/net/core/somaxconn").strip().isdigit()
    with pytest.raises(HostError, match="cannot run commands as root"):
        host.read_root_file("/root/.profile")  # /root is 0700


def test_a_sysctl_the_kernel_lacks_is_said_and_left_out_not_the_end_of_the_apply(
        lab, perfpipe_env, tmp_path, monkeypatch, capsys):
    """A profile's key this kernel does not have (as `kernel.sched_latency_ns` in the IBM
    profile, gone since Linux 5.13): setting it failed and stopped the apply before its
    limits, TasksMax and the keys after it, at every retry."""
    host = lab_hosts()[1]
    before = host_state(host)
    profile = (Path(INVENTORY).parents[1] / "tuning" / "lab-net.yml").read_text()
    (tmp_path / "lab-gone.yml").write_text(profile.replace("name: lab-net", "name: lab-gone")
                                           .replace("sysctl:\n", "sysctl:\n  net.ipv4.perfpipe"
                                                    "_no_such_key: \"1\"\n"))
    monkeypatch.setenv("PERFPIPE_TUNING_DIR", str(tmp_path))
    code, out, err = tune("apply", capsys, "--profile", "lab-gone", "--host", host.name)
    assert code == 0, out + err
    assert [r[-1] for r in rows(out) if r[2] == "net.ipv4.perfpipe_no_such_key"] == ["absent"]
    assert sum(r[-1] == "applied" for r in rows(out)) == 7, out  # 4 sysctls, 2 limits, TasksMax
    assert any("net.ipv4.perfpipe_no_such_key" in line and "key not present on this host: not "
               "set" in line for line in notes(out)), out
    written = host.run(["cat", "/etc/sysctl.d/90-perfpipe.conf"]).stdout
    assert "net.core.somaxconn = 8192" in written and "perfpipe_no_such_key" not in written

    code, out, _ = tune("restore", capsys, "--host", host.name)
    assert code == 0, out
    assert host_state(host) == before


def test_a_restore_goes_on_past_a_record_it_cannot_put_back_and_keeps_it(
        lab, perfpipe_env, capsys):
    """A record whose command fails, one without what it needs, one of a kind this perfpipe
    does not know and a cgroup already gone: the others are still put back, the first
    three are kept for the next restore (exit 1). A host's record that cannot be read is named, and the other hosts
    are restored all the same."""
    import json

    host, other = lab_hosts()[1], lab_hosts()[2]
    was = " ".join(host.run(["cat", "/proc/sys/net/core/somaxconn"]).stdout.split())
    host.as_root(["sysctl", "-q", "-w", "net.core.somaxconn=4321"])
    failing = {"kind": "sysctl", "key": "net.ipv4.tcp_fin_timeout", "before": "not-a-number"}
    unknown = {"kind": "grub", "key": "GRUB_CMDLINE_LINUX", "before": "quiet"}
    incomplete = {"kind": "file", "key": "/etc/sysctl.d/90-perfpipe.conf"}  # no content
    records = [{"kind": "sysctl", "key": "net.core.somaxconn", "before": was},
               {"kind": "tasks_max", "key": "/sys/fs/cgroup/pids/perfpipe-user-0/pids.max",
                "mode": "cgroup", "before": None}, failing, incomplete, unknown]
    folder = perfpipe_env / "tuning"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{host.name}.json").write_text(json.dumps({"profile": "lab-net",
                                                          "records": records}))
    (folder / f"{other.name}.json").write_text("{torn")

    code, out, err = tune("restore", capsys, "--host", host.name, "--host", other.name)
    assert code == 1
    assert " ".join(host.run(["cat", "/proc/sys/net/core/somaxconn"]).stdout.split()) == was
    assert {r[2]: r[-2] for r in rows(out) if r[0] == host.name} == {
        "net.core.somaxconn": "yes", "/sys/fs/cgroup/pids/perfpipe-user-0/pids.max": "yes",
        "net.ipv4.tcp_fin_timeout": "NO", "/etc/sysctl.d/90-perfpipe.conf": "NO",
        "GRUB_CMDLINE_LINUX": "NO"}, out
    assert json.loads((folder / f"{host.name}.json").read_text())["records"] == [
        failing, incomplete, unknown]
    (line,) = [e for e in err.splitlines() if e.startswith(f"{other.name}: ERROR")]
    assert f"{folder / other.name}.json: not a tuning record" in line, err
    assert (folder / f"{other.name}.json").read_text() == "{torn"  # kept as it was
    for name in (host.name, other.name):
        (folder / f"{name}.json").unlink()


def test_a_record_is_the_machines_it_was_written_for_and_one_tune_of_it_at_a_time(
        lab, perfpipe_env, monkeypatch, capsys):
    """Records are kept by host name: another inventory's `driver1` (another machine) is
    not given this one's before-values, nor the other way round; and a tune or restore of
    a host waits for another one of it (each saves the record whole)."""
    import json

    from tasks.tuning import runner

    host = lab_hosts()[1]
    now = " ".join(host.run(["cat", "/proc/sys/net/core/somaxconn"]).stdout.split())
    record = perfpipe_env / "tuning" / f"{host.name}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = {"profile": "lab-net", "host": "10.0.0.5:22", "records": [
        {"kind": "sysctl", "key": "net.core.somaxconn", "before": now}]}  # puts back as is
    record.write_text(json.dumps(elsewhere))
    for mode in ("restore", "apply"):
        code, out, err = tune(mode, capsys, "--host", host.name)
        assert code == 1 and not rows(out), out
        assert err.strip() == (f"{host.name}: ERROR {record}: written for 10.0.0.5:22, "
                               f"and this host is {host.where}; nothing was changed on this "
                               "host: restore it with the inventory that applied it, or move "
                               "it away"), err
        assert json.loads(record.read_text()) == elsewhere
    assert host.where == "10.250.77.12:22"
    code, out, err = tune("check", capsys, "--host", host.name)  # reads no record
    assert code == 0 and rows(out) and not err, out + err

    record.write_text(json.dumps({**elsewhere, "host": host.where}))
    monkeypatch.setattr(runner, "RECORD_WAIT_S", 0.5)
    with runner._one_at_a_time(perfpipe_env, host, by="run nightly-x, step tune"):
        code, _, err = tune("restore", capsys, "--host", host.name)
    assert code == 1 and "the tuning record of driver1 is taken by tuning driver1, by run " \
        "nightly-x, step tune, since " in err, err
    code, out, _ = tune("restore", capsys, "--host", host.name)
    assert code == 0 and not record.exists(), out


def test_a_runs_teardown_leaves_the_tuning_another_open_run_measures_with(lab, perfpipe_env):
    """Two Airflow runs (the nightly and a release) take turns step by step, not run by
    run: run A tunes a host, run B tunes it too (nothing left to change), and A's teardown
    put it back while B was still to measure on it. Now the record names the runs that
    hold it: A's teardown leaves the host tuned while B is open, and B's puts it back."""
    import json

    from tasks.settings import load_settings
    from tasks.tuning import runner
    from tasks.tuning.profile import load_profile

    host = lab_hosts()[1]
    before = host_state(host)
    inventory = load_inventory(INVENTORY)
    profile = load_profile(load_settings().tuning_dir, inventory.tuning_profile)
    for run in ("run-a", "run-b"):
        runner.tune(host, profile, mode="apply", allow=inventory.host(host.name).tuning_allow,
                    state_dir=perfpipe_env, holder=run)
    tuned = host_state(host)
    assert tuned != before
    record = perfpipe_env / "tuning" / f"{host.name}.json"
    assert json.loads(record.read_text())["held_by"] == ["run-a", "run-b"]
    with pytest.raises(runner.HeldByOthers, match="run-b, still open"):
        runner.restore(host, state_dir=perfpipe_env, holder="run-a",
                       is_open={"run-b"}.__contains__)
    assert host_state(host) == tuned
    assert json.loads(record.read_text())["held_by"] == ["run-b"]
    runner.restore(host, state_dir=perfpipe_env, holder="run-b", is_open=lambda _run: True)
    assert host_state(host) == before and not record.exists()


def test_teardown_leaves_a_host_an_open_run_holds_not_one_a_stale_run_holds(
        lab, tiny_suite, tmp_path, capsys):
    """Teardown asks the store which runs that tuned a host are still open: one planned
    now holds driver1's tuning, so this run's teardown leaves it applied and says so; one
    left `running` two days ago (a CLI run killed, say) holds nothing and is named. Once
    the first one has closed, the next teardown puts driver1 back."""
    import json
    from datetime import datetime, timedelta, timezone

    from sql import Store
    from tasks.run_context import RunContext
    from tasks.settings import load_settings
    from tasks.steps.plan import plan_run
    from tasks.steps.tune import restore_run_tuning
    from tasks.tuning.runner import snapshot_path

    inventory, driver1, before = driver1_tuned(tmp_path)
    tuned = host_state(driver1)
    settings = load_settings()
    store = Store(settings.database_url())
    other = plan_run(settings, suite="tiny", inventory=inventory)
    store.create_run("stale-run", kind="manual", suite="tiny", broker_kind="mosquitto",
                     artifact_dir=str(tmp_path),
                     started_at=datetime.now(timezone.utc) - timedelta(days=2))
    record = snapshot_path(settings.state_dir, "driver1")
    record.write_text(json.dumps({**json.loads(record.read_text()),
                                  "held_by": [other, "stale-run"]}))
    ctx = RunContext.load(settings, plan_run(settings, suite="tiny", inventory=inventory))

    problems: list[str] = []
    said: list[str] = []
    assert restore_run_tuning(ctx, problems, said.append) == {} and problems == []
    assert host_state(driver1) == tuned
    assert json.loads(record.read_text())["held_by"] == [other]
    assert any(line.startswith("teardown: run(s) stale-run still open after 1 day") for line in said)
    assert f"teardown: tuning on driver1 left applied for run(s) {other}, still open, which " \
        "put it back at their own teardown" in said, said
    store.finish_run(other, "ok")
    assert restore_run_tuning(ctx, problems, said.append)["driver1"] > 0 and problems == []
    assert host_state(driver1) == before and not record.exists()
    capsys.readouterr()
