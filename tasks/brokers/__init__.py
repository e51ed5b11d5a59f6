"""Broker adapters: start, stop, health check and version of a broker under test.

`ADAPTERS` maps each inventory `broker.kind` to its adapter; every adapter implements
`BrokerAdapter` (`base.py`). Helpers they share have modules of their own: `errors`,
`health` (MQTT CONNECT), `sys_topics` ($SYS), `tls` (throwaway certificates), `affinity`
(a running broker's threads moved between CPUs). The IBM MQ file formats (`qmini`,
`mqxr`) live here too; `tasks.tuning` uses them, never the reverse.
"""

from .activemq import ActiveMQ
from .base import BrokerAdapter
from .emqx import Emqx
from .errors import BrokerError
from .ibmmq import IbmMq
from .mosquitto import Mosquitto
from .rabbitmq import RabbitMQ
from .tbmq import Tbmq

# IBM MQ, EMQX and TBMQ are configuration only: perfpipe cannot start them (managed: false).
ADAPTERS: dict[str, type[BrokerAdapter]] = {
    adapter.kind: adapter for adapter in (Mosquitto, ActiveMQ, RabbitMQ, IbmMq, Emqx, Tbmq)}

__all__ = ["ADAPTERS", "ActiveMQ", "BrokerAdapter", "BrokerError", "Emqx", "IbmMq", "Mosquitto",
           "RabbitMQ", "Tbmq"]
