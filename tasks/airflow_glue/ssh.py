"""SSH details from an Airflow Connection, through the SSH provider's hook.

An inventory host with ``ssh_conn_id`` takes its address, port, user and key (a key file
or the private key itself, kept in the Connection's extra) from Airflow's connections or
secrets backend, so no key has to sit next to the DAGs. The key stays in memory: it is
handed to paramiko and never written, logged or returned.

The host is checked as the SSH provider's hook checks it: against the Connection's
``host_key`` when it has one and this machine's known_hosts files, a host in neither
refused; ``no_host_key_check: true`` takes a host known to neither (and no pin), and
``allow_host_key_change: true`` reads no known_hosts and takes a new key, the pin still
checked. A host reached any other way takes any key, as fabric does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hosts import HostKeyCheck


@dataclass(frozen=True)
class SshDetails:
    address: str
    port: int
    user: str
    connect_kwargs: dict = field(repr=False)
    host_key_check: HostKeyCheck = HostKeyCheck()


def from_connection(conn_id: str) -> SshDetails:
    from airflow.providers.ssh.hooks.ssh import SSHHook

    hook = SSHHook(ssh_conn_id=conn_id)
    kwargs: dict = {"look_for_keys": False}
    if hook.pkey is not None:
        kwargs["pkey"] = hook.pkey
    elif hook.key_file:
        kwargs["key_filename"] = hook.key_file
        if hook.password:  # the provider's rule: with a key file, the password unlocks it
            kwargs["passphrase"] = hook.password
    elif hook.password:
        kwargs["password"] = hook.password
    check = HostKeyCheck(pinned=None if hook.no_host_key_check else hook.host_key,
                         strict=not (hook.no_host_key_check or hook.allow_host_key_change),
                         known_hosts=not hook.allow_host_key_change)
    return SshDetails(hook.remote_host, int(hook.port or 22), hook.username or "root", kwargs,
                      check)
