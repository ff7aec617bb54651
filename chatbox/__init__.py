"""chatbox: a self-hosted chat appliance."""

__version__ = "0.1.0"
