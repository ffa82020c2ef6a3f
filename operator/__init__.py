"""sonicsite.operator: the control plane (discovery, load view, admission, xDS, autoscaling).

Imported as `sonicsite.operator` only. Anything that runs Python with this repository's root
as its working directory and an isolated start (Triton's Python-backend stub) would find this
folder before the standard library's `operator`; the launcher runs servers in the site
directory for that reason.
"""
