"""The admission pass: a model's answers carry it, a shed spares who brings it back."""

from __future__ import annotations

import gc
import math
import weakref

import pytest

from sonicsite.contract.admission_pass import PASS_EPOCH_S, AdmissionPasses, ModelPasses

KEY = b"a-site-key-of-some-length"


def test_a_pass_is_the_sites_and_the_models_and_lapses_by_itself():
    passes, now = AdmissionPasses(KEY), 1_000_000.0
    given = passes.current("m", now)
    assert passes.admits("m", given, now)
    # another holder of the key (a restarted operator, a second gateway) agrees
    assert AdmissionPasses(KEY).admits("m", given, now + 1.0)
    # the model's, the key's: not another model's, not another site's
    assert not passes.admits("n", given, now)
    assert not AdmissionPasses(b"another-site-key-entirely").admits("m", given, now)
    assert passes.current("n", now) != given
    # a caller's own word is no pass
    for claimed in (None, "", "1", "true", given[:-1], given + "0", "\u00e9" * 32):
        assert not passes.admits("m", claimed, now)
    # valid in its epoch and beside it (clocks differ), then void unless answered again
    assert passes.admits("m", given, now + PASS_EPOCH_S)
    assert passes.admits("m", given, now - PASS_EPOCH_S)
    assert not passes.admits("m", given, now + 2 * PASS_EPOCH_S)
    assert passes.admits("m", passes.current("m", now + 2 * PASS_EPOCH_S), now + 2 * PASS_EPOCH_S)
    assert passes.current("m", now) in passes.accepted("m", now)
    assert passes.of("m", now) == ModelPasses(given, passes.accepted("m", now))
    assert len(set(passes.accepted("m", now))) == 3


def test_a_key_too_short_or_unreadable_is_named(tmp_path):
    with pytest.raises(ValueError, match="at least 16 bytes"):
        AdmissionPasses(b"short")
    missing = tmp_path / "admission.key"
    with pytest.raises(ValueError, match=f"admission key {missing}: cannot be read"):
        AdmissionPasses.from_file(str(missing))
    missing.write_text("short\n")
    with pytest.raises(ValueError, match=f"admission key {missing}: expected a key of at least 16"):
        AdmissionPasses.from_file(str(missing))
    missing.write_text(KEY.decode() + "\n")
    assert AdmissionPasses.from_file(str(missing)) == AdmissionPasses(KEY)


def test_the_passes_kept_are_the_instances_own_and_the_live_epochs_only():
    """The passes were kept in a process-wide cache keyed by the instance (lru_cache on the
    method): every AdmissionPasses ever made lived on in it. Now each keeps its own, for
    the epochs about now, and goes when it is no longer used."""
    passes, now = AdmissionPasses(KEY), 1_000_000.0
    given = passes.current("m", now)
    assert AdmissionPasses(KEY) == passes and hash(AdmissionPasses(KEY)) == hash(passes)
    for step in range(1, 50):  # a day of epochs goes by
        assert passes.admits(
            "m", passes.current("m", now + step * PASS_EPOCH_S), now + step * PASS_EPOCH_S
        )
    assert not passes.admits("m", given, now + 49 * PASS_EPOCH_S)
    epoch = math.floor((now + 49 * PASS_EPOCH_S) / PASS_EPOCH_S)
    assert set(passes._kept) <= set(range(epoch - 2, epoch + 2))
    gone = weakref.ref(passes)
    del passes
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize(
    "token_of, accepts",
    [
        (AdmissionPasses.control_token, AdmissionPasses.controls),
        (AdmissionPasses.view_token, AdmissionPasses.views),
    ],
    ids=["control", "view"],
)
def test_each_token_is_the_keys_and_no_pass_nor_the_other_token(token_of, accepts):
    """The operator's PUTs need the control token (operator/api.py), the gateway's gRPC view
    the view token (grpc_view.py): the key's holders agree on each, another key's token, a
    pass, the other token, a header's latin-1 text (compare_digest raised on it) are
    refused. Each is computed once per instance: every call to the view asks for it."""
    passes, now = AdmissionPasses(KEY), 1_000_000.0
    token = token_of(passes)
    assert token_of(passes) is token
    assert accepts(AdmissionPasses(KEY), token)
    assert not accepts(AdmissionPasses(b"another-site-key-entirely"), token)
    other = passes.view_token() if token == passes.control_token() else passes.control_token()
    for claimed in (None, "", token[:-1], token + "0", passes.current("m", now), other):
        assert not accepts(passes, claimed)
    assert not accepts(passes, "\u00e9" * 64)
    assert token not in passes.accepted("m", now) and KEY.hex() not in token
