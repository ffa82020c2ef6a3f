"""sonicsite: inference-as-a-service for high-energy-physics computing sites."""

__version__ = "0.1.0"
