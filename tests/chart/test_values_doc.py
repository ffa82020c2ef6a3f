"""Every value is described once, in values.yaml; the README's table is generated from it
(charts/tools/values_doc.py, `make chart-docs`); values.schema.json checks types only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import yaml
from chartcheck import CHART
from values_doc import BEGIN, END, documented, leaves, main, table, undocumented, with_table

VALUES_TEXT = (CHART / "values.yaml").read_text()
README = CHART / "README.md"
ROOT = CHART.parents[1]


def test_every_value_has_a_description_in_values_yaml():
    assert undocumented(VALUES_TEXT) == []
    described = {v.path for v in documented(VALUES_TEXT)}
    assert {"operator.admission.shedAboveMs", "triton.resources", "image.tag"} <= described
    assert all(v.description for v in documented(VALUES_TEXT))


def test_the_readmes_table_is_generated_from_values_yaml():
    readme = README.read_text()
    assert readme == with_table(readme, VALUES_TEXT), (
        "charts/sonicsite/README.md: the values table is stale; run `make chart-docs`"
    )


def test_the_readme_has_no_hand_written_value_rows_outside_the_table():
    readme = README.read_text()
    before, _, rest = readme.partition(BEGIN)
    _, _, after = rest.partition(END)
    assert "| `" not in before + after


def test_descriptions_continue_over_lines_and_cover_the_object_below():
    text = textwrap.dedent(
        """\
        # A header comment, not a description.

        # -- Servers,
        # two lines.
        replicas: 1
        image:
          # -- The tag.
          tag: ""
          repository: r
        # -- Requests and limits.
        resources:
          requests: {cpu: "1"}
        extra:

          # -- Parted from its key by a blank line: no description.

          one: 1
        plain: {}
        """
    )
    rows = {v.path: (v.default, v.description) for v in documented(text)}
    assert rows == {
        "replicas": (1, "Servers, two lines."),
        "image.tag": ("", "The tag."),
        "resources": ({"requests": {"cpu": "1"}}, "Requests and limits."),
    }
    assert sorted(leaves(yaml.safe_load(text))) == [
        "extra.one",
        "image.repository",
        "image.tag",
        "plain",
        "replicas",
        "resources.requests.cpu",
    ]
    assert undocumented(text) == ["image.repository", "extra.one", "plain"]
    lines = table(text).splitlines()
    assert lines[0] == BEGIN and lines[-1] == END
    assert lines[3] == "| `replicas` | `1` | Servers, two lines. |"
    assert '| `resources` | `{"requests": {"cpu": "1"}}` | Requests and limits. |' in lines


def test_a_stale_table_fails_the_check_and_make_chart_docs_rewrites_it(tmp_path, capsys):
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.yaml").write_text("# -- A value.\nreplicas: 1\n")
    (chart / "README.md").write_text(f"# chart\n\n{BEGIN}\n| `old` | `2` | gone |\n{END}\n")
    assert main([str(chart), "--check"]) == 1
    assert "run `make chart-docs`" in capsys.readouterr().out
    assert main([str(chart)]) == 0
    assert "| `replicas` | `1` | A value. |" in (chart / "README.md").read_text()
    assert "`old`" not in (chart / "README.md").read_text()
    assert main([str(chart), "--check"]) == 0
    (chart / "values.yaml").write_text("# -- A value.\nreplicas: 1\nforgotten: 2\n")
    assert main([str(chart)]) == 1
    assert "no `# --` description for forgotten" in capsys.readouterr().err


def test_the_readme_needs_its_markers(tmp_path):
    with pytest.raises(ValueError, match="expected the markers"):
        with_table("# chart without a table\n", VALUES_TEXT)


def test_the_script_runs_from_the_repository_root():
    command = [sys.executable, "charts/tools/values_doc.py", "charts/sonicsite", "--check"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def _schema_nodes(node, path=""):
    if isinstance(node, dict):
        yield path, node
        for key, sub in node.items():
            yield from _schema_nodes(sub, f"{path}/{key}")
    elif isinstance(node, list):
        for index, sub in enumerate(node):
            yield from _schema_nodes(sub, f"{path}[{index}]")


def _resolved(schema: dict, node: dict) -> dict:
    """A schema node with its `$ref`s (to the schema's `$defs`) followed."""
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def test_the_schema_checks_types_strictly_and_repeats_no_description():
    schema = json.loads((CHART / "values.schema.json").read_text())
    nodes = list(_schema_nodes(schema))
    assert [p for p, n in nodes if "description" in n] == []
    objects = [(path, n) for path, n in nodes if "properties" in n]
    loose = [path for path, n in objects if n.get("additionalProperties") is not False]
    assert objects and loose == []  # every object with declared keys refuses unknown ones
    values = yaml.safe_load(VALUES_TEXT)

    def declared(node: dict, value: object, path: str) -> list[str]:
        node = _resolved(schema, node)
        if not isinstance(value, dict) or "properties" not in node:
            return []
        missing = [f"{path}.{k}".lstrip(".") for k in value if k not in node["properties"]]
        return missing + [
            m
            for k, v in value.items()
            if k in node["properties"]
            for m in declared(node["properties"][k], v, f"{path}.{k}")
        ]

    assert declared(schema, values, "") == []  # every value has a type in the schema


def test_every_choice_the_schema_allows_is_named_in_the_values_description():
    """A value the schema holds to a set of choices (an enum, of it or of its items) names
    each of them in values.yaml, so that the README offers what the chart takes."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    checked = []
    for value in documented(VALUES_TEXT):
        node = schema
        for key in value.path.split("."):
            node = _resolved(schema, node).get("properties", {}).get(key)
            if node is None:
                break
        if node is None:
            continue
        node = _resolved(schema, node)
        choices = node.get("enum") or _resolved(schema, node.get("items", {})).get("enum")
        if choices:
            checked.append(value.path)
            missing = [c for c in choices if str(c) not in value.description]
            assert missing == [], (value.path, value.description)
    assert {"envoy.service.type", "gateway.service.type", "operator.balancing"} <= set(checked)


def test_the_charts_readme_names_every_partial_of_shared_snippets():
    readme = (CHART.parent / "README.md").read_text()
    partials = sorted(p.name for p in (CHART / "templates").glob("_*.tpl"))
    assert len(partials) > 1
    assert [p for p in partials if f"`{p}`" not in readme] == []


def test_sites_that_render_without_the_cluster_are_told_to_bring_the_kept_keys():
    """A key the chart makes once and keeps (sonicsite.persistentKey) is found with `lookup`,
    which `helm template` (and Argo CD), `--dry-run` cannot do: a new key at every render. The
    README names, for each, the existingSecret value that makes it the site's."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    values = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        text = path.read_text()
        if "sonicsite.persistentKey" not in text:
            continue
        (helper,) = set(re.findall(r'include "(sonicsite\.\w+KeySecret)"', text))
        body = helpers.split(f'define "{helper}"', 1)[1].split("{{- end -}}", 1)[0]
        values += re.findall(r"\.Values\.([\w.]+\.existingSecret)", body)
    assert sorted(values) == [
        "operator.admission.passKey.existingSecret",
        "triton.adminKey.existingSecret",
    ]
    readme = README.read_text()
    (paragraph,) = [p for p in readme.split("\n\n") if "`lookup`" in p]
    for words in ("`helm template`", "Argo CD", "--dry-run", *(f"`{v}`" for v in values)):
        assert words in paragraph, words
