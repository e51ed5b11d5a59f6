"""Broker adapters: start, stop, health check and version of a broker under test."""

from .activemq import ActiveMQ
from .emqx import Emqx
from .ibmmq import IbmMq
from .mosquitto import BrokerError, Mosquitto
from .rabbitmq import RabbitMQ
from .tbmq import Tbmq

ADAPTERS = {"mosquitto": Mosquitto, "activemq": ActiveMQ, "rabbitmq": RabbitMQ,
            # configuration only: perfpipe cannot start these (managed: false)
            "ibmmq": IbmMq, "emqx": Emqx, "tbmq": Tbmq}

__all__ = ["ADAPTERS", "ActiveMQ", "BrokerError", "Emqx", "IbmMq", "Mosquitto", "RabbitMQ", "Tbmq"]
