"""sonicsite.operator: the control plane (discovery, load view, admission, xDS, autoscaling)."""
