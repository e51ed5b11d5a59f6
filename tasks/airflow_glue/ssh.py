"""SSH details from an Airflow Connection, through the SSH provider's hook.

An inventory host with ``ssh_conn_id`` takes its address, port, user and key (a key file
or the private key itself, kept in the Connection's extra) from Airflow's connections or
secrets backend, so no key has to sit next to the DAGs. The key stays in memory: it is
handed to paramiko and never written, logged or returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SshDetails:
    address: str
    port: int
    user: str
    connect_kwargs: dict = field(repr=False)


def from_connection(conn_id: str) -> SshDetails:
    from airflow.providers.ssh.hooks.ssh import SSHHook

    hook = SSHHook(ssh_conn_id=conn_id)
    kwargs: dict = {"look_for_keys": False}
    if hook.pkey is not None:
        kwargs["pkey"] = hook.pkey
    elif hook.key_file:
        kwargs["key_filename"] = hook.key_file
    elif hook.password:
        kwargs["password"] = hook.password
    return SshDetails(hook.remote_host, int(hook.port or 22), hook.username or "root", kwargs)
