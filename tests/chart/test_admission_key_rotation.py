"""How a site admin rotates the admission key, told where they look (the value's description,
the README, NOTES.txt) and true to the templates: the key is in one Secret (the chart's, kept
across upgrades, or the site's), mounted in the operator's and the gateway's pods, which read
it once at start (`--admission-key-file`) and carry no checksum of it, so a new key is taken
up only by restarting both."""

from __future__ import annotations

from chartcheck import CHART, objects, one_object, render
from values_doc import documented

NOTES = "sonicsite/templates/NOTES.txt"
KEY_FILE = "/etc/sonicsite/admission/admission-key"


def _said(text: str) -> str:
    return " ".join(text.split())


def _key_secret(docs: list[dict], deployment: dict) -> str:
    """The Secret the Deployment's pods read the admission key from, checked to be read at
    start from the mounted file."""
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert f"--admission-key-file={KEY_FILE}" in container["args"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "admission-key"]
    assert mount["mountPath"] == KEY_FILE.rsplit("/", 1)[0]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "admission-key"]
    # nothing on the pod follows the Secret's content: a new key rolls no pod
    assert not [a for a in pod["metadata"].get("annotations", {}) if a.startswith("checksum/")]
    return volume["secret"]["secretName"]


def test_the_values_description_tells_how_to_rotate_the_key():
    (value,) = [
        v
        for v in documented((CHART / "values.yaml").read_text())
        if v.path == "operator.admission.passKey.existingSecret"
    ]
    said = value.description
    for words in ("rotate", "admission-key", "rollout restart", "operator", "gateway", "shed"):
        assert words in said, (words, said)


def test_the_readme_tells_how_to_rotate_the_key_and_what_it_does_to_passes():
    readme = (CHART / "README.md").read_text()
    assert "\n## Rotating the admission key\n" in readme
    section = readme.split("\n## Rotating the admission key\n", 1)[1].split("\n## ", 1)[0]
    said = _said(section)
    for words in (
        "`operator.admission.passKey.existingSecret`",
        "`<fullname>-operator-admission-key`",
        "`admission-key`",
        "--admission-key-file",
        "kubectl -n <namespace> rollout restart",
        "at start",
        "in a shed",
        "retryAfterSeconds",
        "held-request counts",
    ):
        assert words in said, (words, said)


def test_notes_name_the_secret_and_the_restart_of_both_readers():
    rendered = render({})
    docs = objects(rendered)
    operator = one_object(docs, "Deployment", "operator")
    gateway = one_object(docs, "Deployment", "gateway")
    secret = _key_secret(docs, operator)
    assert _key_secret(docs, gateway) == secret
    assert one_object(docs, "Secret", "operator")["metadata"]["name"] == secret
    notes = _said(rendered[NOTES])
    assert f"Secret {secret} (key admission-key)" in notes, notes
    restart = (
        f"kubectl -n hep rollout restart deployment/{operator['metadata']['name']} "
        f"deployment/{gateway['metadata']['name']}"
    )
    assert restart in notes, notes


def test_notes_name_the_sites_own_secret_and_the_operator_alone_without_a_gateway():
    values = {
        "operator": {"admission": {"passKey": {"existingSecret": "site-passes"}}},
        "gateway": {"enabled": False},
    }
    rendered = render(values)
    docs = objects(rendered)
    operator = one_object(docs, "Deployment", "operator")
    assert _key_secret(docs, operator) == "site-passes"
    assert not [d for d in docs if d["kind"] == "Secret" and "admission" in d["metadata"]["name"]]
    notes = _said(rendered[NOTES])
    assert "Secret site-passes (key admission-key)" in notes, notes
    restart = f"kubectl -n hep rollout restart deployment/{operator['metadata']['name']}"
    assert restart + " " in notes or notes.endswith(restart), notes
    assert "deployment/site-sonicsite-gateway" not in notes
