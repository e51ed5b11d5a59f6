"""Broker adapters: start, stop, health check and version of a broker under test."""

from .activemq import ActiveMQ
from .mosquitto import BrokerError, Mosquitto

ADAPTERS = {"mosquitto": Mosquitto, "activemq": ActiveMQ}

__all__ = ["ADAPTERS", "ActiveMQ", "BrokerError", "Mosquitto"]
