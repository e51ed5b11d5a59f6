"""The error every broker adapter and helper raises."""


class BrokerError(RuntimeError):
    """The broker could not be started, reached or stopped; the message says which host."""
