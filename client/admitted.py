"""The admission passes this client holds: a site's shed holds back only the callers its
model has not answered yet.

The site sheds an overloaded model so that new work waits (operator/admission.py). A
refused request of a job that is already running is no less work for the site: the job
sends it again after its back-off, and only that job's wait grows; under a closed
population of jobs the queue is set by how many jobs run (Little's law). So a model's
answers through Envoy and the gateway carry the model's admission pass (`ADMITTED_HEADER`,
sonicsite/contract/admission_pass.py), the client sends the last pass it got back on that
model's requests, and a shed refuses only requests without a valid one
(`AdmissionRecord.refuses`; Envoy's inference routes and the gateway check it): jobs that
have not started wait at their start, running ones finish at their pace. One set per
client, shared by its transports: a pass got through Envoy holds at the gateway too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sonicsite.contract.wire import ADMITTED_HEADER


@dataclass
class Admitted:
    passes: dict[str, str] = field(default_factory=dict)  # model → the last pass it gave

    def headers(self, model: str) -> dict[str, str]:
        """The header a request for `model` carries: none until the site gave a pass."""
        given = self.passes.get(model)
        return {ADMITTED_HEADER: given} if given else {}

    def answered(self, model: str, given: str | None) -> None:
        """A reply of `model` came with `given` (None: without a pass, as from a server
        reached directly, which sheds nothing: the pass held is kept)."""
        if given:
            self.passes[model] = given  # one item set: safe beside the stream's other threads
