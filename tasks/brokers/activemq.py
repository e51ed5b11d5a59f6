"""ActiveMQ 5 (Debian's package, with its MQTT transport): a JVM broker that runs here.

perfpipe starts its own instance (config in the run folder, no persistence, one MQTT
connector) instead of the packaged init script, so its JVM options are exactly the ones
in the instance options file that tuning manages (`OPTIONS_FILE`, Debian's per-instance
format: ``ACTIVEMQ_OPTS="-Xms512M -Xmx512M"``). After start the heap is read from the
running JVM with ``jcmd VM.flags`` and recorded.
"""

from __future__ import annotations

import re
import shlex

from ..hosts import Host
from ..rundir import BROKER_DIR
from .base import BrokerAdapter
from .errors import BrokerError
from .health import Launched, bind_address, health_check

HOME = "/usr/share/activemq"
OPTIONS_FILE = "/etc/activemq/instances-available/perfpipe/options"
DEFAULT_OPTS = "-Xms512M -Xmx512M"
EXTRA_CLASSPATH = "/usr/share/java/mqtt-client.jar"  # the MQTT codec the transport needs
_OPTS_LINE = re.compile(r'^[ \t]*ACTIVEMQ_OPTS[ \t]*=[ \t]*"(?P<opts>[^"]*)"[ \t]*$', re.M)
_HEAP_OPTION = r"-Xm[sx]\d+[KMGkmg]?"  # -Xms512M, -Xmx4G
_HEAP = re.compile(f"^{_HEAP_OPTION}$")  # one shell word
_HEAP_WORD = re.compile(rf"(?<!\S){_HEAP_OPTION}(?!\S)\s*")  # in a line, with what follows it

CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
                           http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="perfpipe"
          persistent="false" useJmx="false" dataDirectory="{data}">
    <transportConnectors>
      <transportConnector name="mqtt" uri="mqtt://{bind}:{port}?maximumConnections=1000000"/>
    </transportConnectors>
  </broker>
</beans>
"""


def heap_options(options_text: str | None) -> list[str]:
    """The -Xms/-Xmx options of an instance options file (only those: nothing else is run)."""
    match = _OPTS_LINE.search(options_text or "")
    opts = shlex.split(match["opts"]) if match else shlex.split(DEFAULT_OPTS)
    return [o for o in opts if _HEAP.match(o)]


def with_heap(options_text: str | None, xms: str, xmx: str) -> str:
    """An options file with ACTIVEMQ_OPTS's heap set (other options and lines kept)."""
    text = options_text if options_text is not None else f'ACTIVEMQ_OPTS="{DEFAULT_OPTS}"\n'
    match = _OPTS_LINE.search(text)
    if not match:
        return text.rstrip("\n") + f'\nACTIVEMQ_OPTS="-Xms{xms} -Xmx{xmx}"\n'
    kept = _HEAP_WORD.sub("", match["opts"]).strip()  # the rest as written, quotes and all
    line = f'ACTIVEMQ_OPTS="{" ".join(filter(None, [f"-Xms{xms}", f"-Xmx{xmx}", kept]))}"'
    return text[:match.start()] + line + text[match.end():]


def running_heap(host: Host, pid: int) -> dict[str, int]:
    """InitialHeapSize and MaxHeapSize (bytes) of a running JVM, from jcmd."""
    out = host.run(["jcmd", str(pid), "VM.flags"], timeout=30).stdout
    flags = dict(re.findall(r"-XX:(InitialHeapSize|MaxHeapSize)=(\d+)", out))
    return {k: int(v) for k, v in flags.items()}


def heap_bytes(option: str) -> int:
    size = option[4:]
    unit = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(size[-1].lower(), 1)
    return int(size.rstrip("KMGkmg")) * unit


def verify_heap(options: list[str], running: dict[str, int], host_name: str) -> None:
    """The running JVM must have exactly the heap the options ask for."""
    wanted = {("InitialHeapSize" if o.startswith("-Xms") else "MaxHeapSize"): heap_bytes(o)
              for o in options}
    wrong = {k: (v, running.get(k)) for k, v in wanted.items() if running.get(k) != v}
    if wrong:
        raise BrokerError(f"{host_name}: the running ActiveMQ JVM does not have the heap asked "
                          f"for (wanted, running): {wrong}")


class ActiveMQ(BrokerAdapter):
    kind = "activemq"
    title = "ActiveMQ"
    process_pattern = r"activemq\.jar"  # its JVM (JMX, its own statistics, is off)

    def version(self) -> str:
        out = self.host.run(["sh", "-c", "ls /usr/share/java/activemq-broker-*.jar"], check=False)
        match = re.search(r"activemq-broker-([\d.]+)\.jar", out.stdout)
        if not match:
            raise BrokerError(f"{self.host.name}: ActiveMQ is not installed "
                              f"(apt-get install activemq libmqtt-client-java, or `make deps`)")
        return match.group(1)

    def start(self, run_dir: str, address: str, port: int) -> dict:
        base = f"{run_dir}/{BROKER_DIR}"
        self.host.mkdir(f"{base}/data")
        self.host.put_text(CONFIG.format(data=f"{base}/data", bind=bind_address(address),
                                         port=port), f"{base}/activemq.xml")
        heap = heap_options(self.host.read_file(OPTIONS_FILE))
        argv = ["java", *heap, f"-Dactivemq.classpath={base}:{EXTRA_CLASSPATH}",
                f"-Dactivemq.home={HOME}", f"-Dactivemq.base={base}", f"-Dactivemq.conf={base}",
                f"-Dactivemq.data={base}/data", "-jar", f"{HOME}/bin/activemq.jar", "start",
                f"xbean:file:{base}/activemq.xml"]
        group = self.launch(argv, f"{base}/activemq.log")
        try:
            health_check(address, port, timeout_s=60,
                         launched=Launched(self.host, f"{base}/activemq.log"))
        except BrokerError as exc:
            self.host.kill_group(group, "KILL")
            raise BrokerError(f"{self.host.name}: ActiveMQ did not accept MQTT on {port} "
                              f"({exc}); see {base}/activemq.log") from None
        pid = int(self.host.read_text(f"{base}/activemq.log.pid").strip())
        running = running_heap(self.host, pid)
        verify_heap(heap, running, self.host.name)
        return {"group_pid": group, "pid": pid, "config": f"{base}/activemq.xml",
                "log": f"{base}/activemq.log", "jvm_options": heap, "jvm_heap": running}

    def stop(self, group_pid: int, timeout_s: float = 20.0) -> None:
        self.host.stop_group(group_pid, timeout_s)
