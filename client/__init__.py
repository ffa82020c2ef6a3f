"""sonicsite.client: the worker library (SoA layouts, copy plans, transports, job streams)."""
