"""A model the site does not serve, against the session's site (real Triton, Envoy and
gateway): `model_info` says it was not found on the site, each endpoint named once; a
stream of it is refused before any chunk goes, naming the model and the models the site
serves (in direct mode, where the stream is made)."""

from __future__ import annotations

import pytest
from sonicsite.client import Client, ModelNotServed, TensorSpec
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_model_info_of_a_model_the_site_lacks_says_not_found(site, transport):
    """Was "model 'nope': no metadata: the site did not answer (envoy: envoy: StatusCode.
    NOT_FOUND: ...; gateway: gateway: 404: ...)": the site did answer, and each endpoint was
    named twice."""
    with Client(from_site_file(site.site_dir), transport) as client:
        with pytest.raises(ModelNotServed) as caught:
            client.model_info("nope")
        served = client.site.models
    said = str(caught.value)
    assert said.startswith("model 'nope': not found on the site ("), said
    assert "no metadata" not in said, said
    endpoints = ["envoy", "gateway"] if transport == "grpc" else ["gateway"]
    for endpoint in endpoints:
        assert said.count(f"{endpoint}: ") == 1, said
    assert said.endswith(f"; the site serves {served}"), said
    assert isinstance(caught.value, ValueError)  # what model_info raised before


def test_a_stream_of_a_model_the_site_lacks_is_refused_before_any_chunk(site):
    """A model the site does not serve: each chunk failed apart with NOT_FOUND, the failed
    chunks in no order, and no exception; the client knows the servers' models. Refused at
    once, nothing sent, the model and the site's models named."""
    sample = generate("simple", 32, seed=4)
    spec = TensorSpec("nope", sample.spec.inputs, sample.spec.outputs)
    sent = []
    with Client(from_site_file(site.site_dir), "grpc") as client:
        served = client.site.models
        assert "simple" in served and "nope" not in served
        stream = client.stream("nope", spec, batch=8, window=2)
        with pytest.raises(ModelNotServed) as caught:
            stream.run(sample, sample.check, on_send=lambda lo, hi: sent.append((lo, hi)))
    said = str(caught.value)
    assert said.startswith("model 'nope': not served by the site (envoy: "), said
    assert f"the site serves {served}" in said, said
    assert sent == [], "a chunk went out"
    with (
        Client(from_site_file(site.site_dir), "grpc", "direct") as client,
        pytest.raises(ModelNotServed, match=r"model 'nope': no server of the site \(.*\) serves"),
    ):
        client.stream("nope", spec)
