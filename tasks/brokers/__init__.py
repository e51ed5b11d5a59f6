"""Broker adapters: start, stop, health check and version of a broker under test."""

from .mosquitto import BrokerError, Mosquitto

ADAPTERS = {"mosquitto": Mosquitto}

__all__ = ["ADAPTERS", "BrokerError", "Mosquitto"]
