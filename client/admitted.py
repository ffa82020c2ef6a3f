"""Which models have answered this client: a site's shed holds back only the callers it has
not admitted yet.

The site sheds an overloaded model so that new work waits (operator/admission.py). A
refused request of a job that is already running is no less work for the site: the job
sends it again after its back-off, and only that job's wait grows; under a closed
population of jobs the queue is set by how many jobs run (Little's law). So once a model
has answered a client, the client says so on that model's later requests
(`ADMITTED_HEADER`), and a shed refuses only requests without it
(`AdmissionRecord.refuses`; Envoy's shed route and the gateway enforce it): jobs that have
not started wait at their start, running ones finish at their pace. One set per client,
shared by its transports: the site's admission is the site's, whichever path a request
takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sonicsite.contract.wire import ADMITTED_HEADER


@dataclass
class Admitted:
    models: set[str] = field(default_factory=set)

    def headers(self, model: str) -> dict[str, str]:
        """The header a request for `model` carries: none until the model has answered."""
        return {ADMITTED_HEADER: "1"} if model in self.models else {}

    def answered(self, model: str) -> None:
        self.models.add(model)  # one set operation: safe beside the stream's other threads
