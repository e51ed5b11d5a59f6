"""IBM MQ Telemetry (the MQXR service of a queue manager): a configuration-only adapter.

IBM MQ does not install from this machine's packages, so perfpipe never creates, starts
or stops a queue manager, its telemetry service or its channels.

It can:
- render what a human (or an existing installation's automation) runs on the queue
  manager host: the setup steps (``crtmqm``/``strmqm``, SYSTEM.MQXR.SERVICE from the
  sample MQ Telemetry ships), the MQSC that defines and starts the MQTT channel on the
  benchmark port, the qm.ini stanzas of the IBM MQ Telemetry report (Appendix A.1.2,
  the same values as the ``ibm-mq-telemetry-server`` tuning profile) and the runmqsc
  commands that fix the MQXR heap (report section 4.2, ``tasks/brokers/mqxr.py``);
  ``python -m tasks.brokers.render ibmmq --qmgr PERF0 --port 1883`` prints them;
- with ``managed: false``: health-check the running channel with an MQTT CONNECT, and read
  the version with ``dspmqver`` on the broker host when ``broker.host`` names it and
  IBM MQ is installed there.

It cannot: start anything (``managed: true`` fails with the fix), tell the version over
MQTT (MQXR publishes no ``$SYS`` topics), or read queue depth (that needs an MQI client).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import mqxr, qmini
from .config_only import ConfigOnlyBroker
from .sys_topics import version_number

QMGR = re.compile(r"^[A-Za-z0-9._/%]{1,48}$")  # IBM MQ object name rules
CHANNEL = re.compile(r"^[A-Za-z0-9._/%]{1,20}$")  # telemetry channel names: at most 20
MCAUSER = re.compile(r"^[A-Za-z0-9._-]{1,12}$")
HEAP = re.compile(r"^\d{1,7}[KMG]$")
PROFILE = "ibm-mq-telemetry-server"
MQXR_SAMPLE = "${MQ_INSTALLATION_PATH:-/opt/mqm}/mqxr/samples/installMQXRService_unix.mqsc"


def check_settings(qmgr: str, channel: str, port: int, mcauser: str | None,
                   xms: str, xmx: str) -> None:
    """Raise ValueError naming the setting and the rule it breaks."""
    if not QMGR.match(qmgr):
        raise ValueError(f"queue manager {qmgr!r}: 1-48 characters of A-Z a-z 0-9 . / _ %")
    if not CHANNEL.match(channel):
        raise ValueError(f"channel {channel!r}: 1-20 characters of A-Z a-z 0-9 . / _ % "
                         f"(telemetry channel names are at most 20 long)")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port}: must be 1..65535")
    if mcauser is not None and not MCAUSER.match(mcauser):
        raise ValueError(f"mcauser {mcauser!r}: a user id of at most 12 characters")
    for name, size in (("xms", xms), ("xmx", xmx)):
        if not HEAP.match(size):
            raise ValueError(f"{name} {size!r}: a heap size like 4096M")


def mqtt_channel_mqsc(qmgr: str, channel: str, port: int, mcauser: str | None = None,
                      backlog: int = 4096) -> str:
    """MQSC for ``runmqsc QMGR``: start MQXR, define and start the benchmark's MQTT channel."""
    user = f" MCAUSER('{mcauser}')" if mcauser else ""
    return "\n".join([
        f"* perfpipe: the MQTT channel of queue manager {qmgr} for the benchmark",
        "* (run with: runmqsc " + qmgr + " < perfpipe-mqtt.mqsc)",
        "START SERVICE(SYSTEM.MQXR.SERVICE)",
        f"DEFINE CHANNEL('{channel}') CHLTYPE(MQTT) TRPTYPE(TCP) PORT({port}) +",
        f"       PROTOCOL(MQTTV311,MQTTV3) BACKLOG({backlog}){user} REPLACE",
        f"START CHANNEL('{channel}') CHLTYPE(MQTT)",
        f"DISPLAY CHSTATUS('{channel}') CHLTYPE(MQTT)",
        *([] if mcauser else [
            "* MCAUSER is left empty: set it to the user whose authority MQTT clients get",
            "* (one allowed to publish and subscribe on the benchmark topics)"]),
        "",
    ])


def setup_script(qmgr: str, channel: str, port: int, qm_ini_path: str) -> str:
    """The steps on the queue manager host, as the mqm user, in order."""
    return "\n".join([
        "#!/bin/sh",
        f"# perfpipe: set up queue manager {qmgr} for MQTT benchmarks; run as mqm on the",
        "# queue manager host. perfpipe does not run this: it cannot start IBM MQ.",
        "set -e",
        f"dspmq -m {qmgr} >/dev/null 2>&1 || crtmqm {qmgr}",
        f"# merge qm.ini.fragment into {qm_ini_path} (or: perfpipe tune --profile {PROFILE} --apply)",
        f"dspmq -m {qmgr} | grep -q 'STATUS(Running)' || strmqm {qmgr}",
        "# SYSTEM.MQXR.SERVICE, when missing, from the sample MQ Telemetry ships",
        f"echo 'DISPLAY SERVICE(SYSTEM.MQXR.SERVICE)' | runmqsc {qmgr} >/dev/null || \\",
        f"  runmqsc {qmgr} < {MQXR_SAMPLE}",
        f"runmqsc {qmgr} < perfpipe-mqtt.mqsc",
        "# the MQXR heap: only once mqxr-heap.mqsc holds the service's own STARTARG (its",
        "# placeholder would replace the -m/-d/-g arguments, and MQXR would not start again)",
        f"if grep -q '{mqxr.PLACEHOLDER}' mqxr-heap.mqsc; then",
        f"  echo \"mqxr-heap.mqsc: replace {mqxr.PLACEHOLDER} with what"
        f" 'DISPLAY SERVICE(SYSTEM.MQXR.SERVICE) STARTARG' shows, then: runmqsc {qmgr} <"
        " mqxr-heap.mqsc\" >&2",
        "  exit 1",
        "fi",
        f"runmqsc {qmgr} < mqxr-heap.mqsc",
        f"# then in the inventory: broker: {{kind: ibmmq, managed: false, address: <this host>, "
        f"port: {port}}}",
        "",
    ])


def report_stanzas(tuning_dir: Path | None = None) -> tuple[str, dict[str, dict[str, str]]]:
    """qm.ini path and stanzas of the report, from the tuning profile that applies them (one
    copy of them: its `qm_ini` section)."""
    from ..config_files import read_yaml, validate
    from ..settings import load_settings

    path = Path(tuning_dir or load_settings().tuning_dir) / f"{PROFILE}.yml"
    section = validate(qmini.QmIni, (read_yaml(path) or {}).get("qm_ini"), f"{path}: qm_ini")
    return section.path, section.stanzas


class IbmMq(ConfigOnlyBroker):
    kind = "ibmmq"
    title = "IBM MQ"
    managed_fix = ("create and start the queue manager and its MQTT channel with the commands "
                   "of `python -m tasks.brokers.render ibmmq` on the queue manager host, then set "
                   "managed: false with the channel's address and port")
    sys_stats_topics = ()  # MQXR publishes no $SYS topics
    # the queue manager's processes and the MQXR JVM (its resource-usage topics,
    # $SYS/MQ/INFO/QMGR/..., are PCF messages for MQI clients, not readable over MQTT)
    process_pattern = r"\b(amqzxma0|amqzlaa0|amqzmuc0|amqzmur0|amqrmppa|amqfqpub|runmqchi)\b|MQXR"

    def version(self) -> str:
        if self.host is None:
            return "unknown"
        result = self.host.run(["dspmqver", "-b", "-f", "2"], check=False)
        return (result.ok and version_number(result.stdout)) or "unknown"

    def probe_version(self, address: str, port: int) -> str:
        return "unknown"  # not over MQTT; see version()

    def stats(self, address: str, port: int, wait_s: float = 0.0) -> dict[str, str]:
        return {}

    def render(self, qmgr: str = "PERF0", channel: str = "PERFPIPE.MQTT", port: int = 1883,
               mcauser: str | None = None, xms: str = "4096M", xmx: str = "4096M",
               qm_ini_path: str | None = None,
               stanzas: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
        check_settings(qmgr, channel, port, mcauser, xms, xmx)
        if stanzas is None:
            default_path, stanzas = report_stanzas()
            qm_ini_path = qm_ini_path or default_path.replace("/PERF0/", f"/{qmgr}/")
        qm_ini_path = qm_ini_path or f"/var/mqm/qmgrs/{qmgr}/qm.ini"
        heap = mqxr.heap_commands(mqxr.PLACEHOLDER, xms, xmx)
        return {
            "setup.sh": setup_script(qmgr, channel, port, qm_ini_path),
            "perfpipe-mqtt.mqsc": mqtt_channel_mqsc(qmgr, channel, port, mcauser),
            "qm.ini.fragment": (f"# perfpipe: stanzas of the IBM MQ Telemetry report (A.1.2) "
                                f"for {qm_ini_path}\n" + qmini.set_values("", stanzas)),
            "mqxr-heap.mqsc": "\n".join([
                f"* perfpipe: fix the MQXR heap (report section 4.2). Replace {mqxr.PLACEHOLDER}",
                "* with the value DISPLAY SERVICE(SYSTEM.MQXR.SERVICE) STARTARG shows.",
                *heap, ""]),
        }
