"""LocalHost's process control against real processes (liveness and a stopped group), and
the ports servers are started on."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tasks import ports
from tasks.hosts import HostError, LocalHost


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_process_that_ended_is_not_alive_before_it_is_reaped():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while proc_state(child.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        os.kill(child.pid, 0)  # a zombie still takes signal 0: kill -0 would say alive
        assert LocalHost().alive(child.pid) is False
        assert LocalHost().alive(os.getpid()) is True
    finally:
        child.wait()
    assert LocalHost().alive(child.pid) is False  # reaped: gone from /proc


def test_a_stopped_group_records_its_exit_code_and_is_no_longer_alive(tmp_path: Path):
    host = LocalHost()
    log = str(tmp_path / "sleep.log")
    group = host.launch(["sleep", "60"], log)
    deadline = time.monotonic() + 5
    while not Path(log + ".pid").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.alive(group) and host.exit_code(log) is None
    host.stop_group(group, timeout_s=10)
    assert host.exit_code(log) == 143  # 128 + SIGTERM, written by the shell that waited
    assert not host.alive(group)


def test_a_server_port_is_outside_the_range_outgoing_connections_take_their_ports_from():
    """A port picked by binding to 0 comes from the ephemeral range, where a client's
    connect() may take it before the server binds it (RabbitMQ failed so, with EADDRINUSE)."""
    first, last = ports.ephemeral_range()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(256)
        clients = [socket.create_connection(listener.getsockname()) for _ in range(50)]
        try:
            client_ports = {c.getsockname()[1] for c in clients}
        finally:
            for client in clients:
                client.close()
    assert all(first <= port <= last for port in client_ports)  # where connect() puts them
    picked = [LocalHost().free_port() for _ in range(3)] + [ports.free_port() for _ in range(20)]
    assert not any(first <= port <= last for port in picked), picked
    assert len(set(picked[3:])) == 20  # one process never hands out a port twice
    for port in picked:
        with socket.socket() as server:
            server.bind(("", port))  # free when handed out


def test_waiting_for_a_server_sees_it_once_it_listens_and_gives_up_at_the_timeout():
    """A server that binds and listens 0.3 s after the wait began is seen within the wait;
    a port nobody listens on is reported as such once the timeout has passed, not before."""
    port = ports.free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_late() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen(1)

    thread = threading.Thread(target=listen_late)
    began = time.monotonic()
    thread.start()
    try:
        assert ports.wait_listening(port, 5)
        assert 0.3 <= time.monotonic() - began < 5
    finally:
        thread.join()
        server.close()
    silent = ports.free_port()
    began = time.monotonic()
    assert not ports.wait_listening(silent, 0.4)
    assert 0.4 <= time.monotonic() - began < 1.4  # it gives up, and not long after


def test_a_host_tuned_for_many_clients_still_gets_a_server_port(tmp_path: Path):
    """perfpipe's own profiles widen the ephemeral range (5000-65000 for clients, 1024-65535
    on the IBM MQ server): the port is then found above the range, or where the range covers
    every port, is the kernel's choice."""
    assert ports.server_ranges(32768, 60999) == [range(10000, 32768), range(61000, 65536)]
    assert ports.server_ranges(5000, 65000) == [range(65001, 65536)]
    assert ports.server_ranges(1024, 65535) == []
    tuned = tmp_path / "ip_local_port_range"
    for text, lowest in (("5000\t65000\n", 65001), ("1024\t65535\n", 1024)):
        tuned.write_text(text)
        port = ports.free_port(range_file=str(tuned))
        assert port >= lowest
        with socket.socket() as server:
            server.bind(("", port))


def test_a_file_written_as_root_keeps_its_owner_and_mode_and_a_new_one_is_roots(tmp_path: Path):
    """Tuning edits files other users own (IBM MQ's qm.ini is mqm's, mode 0660): writing
    and restoring them must not hand them to root."""
    owned = tmp_path / "qm.ini"
    owned.write_text("before\n")
    os.chown(owned, 65534, 65534)
    owned.chmod(0o660)
    host = LocalHost()
    host.write_root_file(str(owned), "after\n")
    stat = owned.stat()
    assert owned.read_text() == "after\n"
    assert (stat.st_uid, stat.st_gid, oct(stat.st_mode & 0o7777)) == (65534, 65534, "0o660")
    linked = tmp_path / "qm-link.ini"  # a link's own mode is 0777: its target's are taken
    linked.symlink_to(owned)
    host.write_root_file(str(linked), "linked\n")
    stat = linked.stat()
    assert (stat.st_uid, oct(stat.st_mode & 0o7777)) == (65534, "0o660")
    assert linked.is_symlink() and owned.read_text() == "linked\n"  # still a link, to it
    new = tmp_path / "sub" / "90-perfpipe.conf"
    host.write_root_file(str(new), "x = 1\n")
    stat = new.stat()
    assert (stat.st_uid, oct(stat.st_mode & 0o7777)) == (0, "0o644")


def test_a_file_is_read_as_root_and_one_that_cannot_be_read_is_not_taken_for_missing(
        tmp_path: Path):
    """What tuning records before it changes a file: None would have its restore delete
    the file, so only a file that is not there reads as None."""
    host = LocalHost()  # root here: the login user's read and root's are one
    (tmp_path / "there").write_text("x = 1\n")
    assert host.read_root_file(str(tmp_path / "there")) == "x = 1\n"
    assert host.read_root_file(str(tmp_path / "not-there")) is None
    assert host.read_root_file(str(tmp_path / "no-folder" / "not-there")) is None
    write_only = "/proc/sys/net/ipv4/route/flush"  # mode 0200: not even root reads it
    with pytest.raises(HostError, match=f"cannot read {write_only}, not even as root"):
        host.read_root_file(write_only)


def test_a_port_a_server_listens_on_is_held_and_one_in_time_wait_is_not(tmp_path: Path):
    """`Host.port_held`, the broker step's check of a fixed broker port, on this host:
    a listener holds its port; a connection closed a moment ago (TIME_WAIT) does not, as
    a broker binding with SO_REUSEADDR takes the port all the same."""
    host = LocalHost(work_root=str(tmp_path))
    port = ports.free_port()
    assert host.port_held(port) is False
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        assert host.port_held(port) is True
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
        client.close()
    assert host.port_held(port) is False


def test_a_driver_host_is_checked_for_the_host_kinds_of_a_broker_servers_profile(
        tmp_path: Path):
    """The IBM MQ server profile on a host that is not the broker's: its sysctl, limits
    and TasksMax are read, the queue manager's qm.ini and the MQXR heap are not (a driver
    host has neither: the tune step failed there, every run). TasksMax's user mqm is not
    on this machine: said, not an error. Check mode: nothing here is changed."""
    import pwd

    from tasks.tuning.profile import load_profile
    from tasks.tuning.runner import tune

    if "mqm" in {p.pw_name for p in pwd.getpwall()}:
        pytest.skip("this machine has an mqm user")
    profile = load_profile(Path(__file__).parent.parent / "infra" / "tuning",
                           "ibm-mq-telemetry-server")
    host = LocalHost(name="driver1", work_root=str(tmp_path))
    entries = tune(host, profile, mode="check", allow=["*"], state_dir=tmp_path,
                   broker_host=False)
    assert {e.kind for e in entries} == {"sysctl", "limits", "tasks_max"}
    (tasks_max,) = [e for e in entries if e.kind == "tasks_max"]
    assert (tasks_max.action, tasks_max.note) == ("check-only",
                                                   "user mqm not on this host: not set")
    assert all(e.action in ("unchanged", "check-only") for e in entries)
    with pytest.raises(HostError, match="qm.ini does not exist"):  # the broker's host
        tune(host, profile, mode="check", allow=["*"], state_dir=tmp_path)
