"""The local site: real Triton servers, Envoy, the operator, the gateway and Prometheus as
processes of this machine, started and stopped by PID (`sonicsite up`, `sonicsite down`)."""
