"""The command line's value types have one home (sonicsite/contract/options.py) and one set
of rules, whichever room's command takes them: a number meant finite refuses NaN and
infinity, names are read with the spaces around them dropped, and every refusal names the
value it was given."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest
from sonicsite.operator.options import parser as operator_parser

from sonicsite.cli_parser import parse_args
from sonicsite.contract.options import (
    finite,
    names,
    names_of,
    non_negative,
    positive,
    split_names,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("finite", "positive", "non_negative", "names", "names_of", "split_names")
NOT_CODE = {"tests", "build", "node_modules"}


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        (finite, "abc", "expected a number, got 'abc'"),
        (finite, "nan", "expected a finite number, got 'nan'"),
        (finite, "-inf", "expected a finite number, got '-inf'"),
        (positive, "0", "expected a number > 0, got '0'"),
        (positive, "inf", "expected a finite number > 0, got 'inf'"),
        (positive, "nan", "expected a finite number > 0, got 'nan'"),
        (positive, "fast", "expected a number > 0, got 'fast'"),
        (non_negative, "-1", "expected a number ≥ 0, got '-1'"),
        (non_negative, "inf", "expected a finite number ≥ 0, got 'inf'"),
        (non_negative, "", "expected a number ≥ 0, got ''"),
    ],
)
def test_a_number_that_is_no_setting_is_refused_naming_it(kind, text, said):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        kind(text)
    assert str(caught.value) == said


def test_finite_numbers_in_range_are_taken_as_written():
    assert finite("-2.5") == -2.5 and positive("1e-3") == 0.001 and positive(" 7 ") == 7.0
    assert non_negative("0") == 0.0 and non_negative("300") == 300.0


def test_names_drop_the_spaces_around_them_and_refuse_none_or_one_twice():
    assert split_names(" a, b ,,c,") == ("a", "b", "c")
    assert names("a, b") == ("a", "b")
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated names, got"):
        names(" , ")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'a, b,a': a named twice$"):
        names("a, b,a")


def test_names_of_a_known_set_name_the_unknown_and_the_known():
    models = names_of(("simple", "particlenet_ak4"), "model")
    assert models("particlenet_ak4, simple") == ("particlenet_ak4", "simple")
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        models("simple,deepmet")
    said = "unknown model(s) ['deepmet']; expected comma-separated names of: simple, "
    said += "particlenet_ak4"
    assert str(caught.value) == said
    with pytest.raises(argparse.ArgumentTypeError, match="names of: simple, particlenet_ak4"):
        models("")


def test_the_bench_refuses_an_infinite_duration(capsys):
    """The bench's `positive` took `inf` (a turn that never ends), which the operator's
    refused: now both are the one type."""
    with pytest.raises(SystemExit):
        parse_args(["bench", "balancing", "--json", "out.json", "--open-seconds", "inf"])
    said = "argument --open-seconds: expected a finite number > 0, got 'inf'"
    assert said in capsys.readouterr().err


def test_the_bench_and_the_operator_refuse_a_value_in_the_same_words(capsys):
    with pytest.raises(SystemExit):
        parse_args(["bench", "balancing", "--json", "out.json", "--work-ms", "nan"])
    bench = capsys.readouterr().err.rsplit("--work-ms: ", 1)[1]
    with pytest.raises(SystemExit):
        operator_parser().parse_args(["--port=1", "--envoy-listen=h:2", "--shed-above-ms=nan"])
    assert capsys.readouterr().err.rsplit("--shed-above-ms: ", 1)[1] == bench


def test_a_model_list_with_spaces_after_its_commas_is_two_models():
    """`--models "simple, particlenet_ak4"` was refused: " particlenet_ak4" is no model."""
    assert parse_args(["up", "--models", "simple, particlenet_ak4"]).models == [
        "simple",
        "particlenet_ak4",
    ]
    assert parse_args(["check", "--grpc", "h:1", "--models", "a, b"]).models == ["a", "b"]
    assert parse_args(["up", "--hold", "simple=triton-0, triton-1"]).hold == [
        ("simple", ["triton-0", "triton-1"])
    ]
    pools = parse_args(["up", "--placement", "--pool", "big=1:simple, deepmet"]).pool
    assert pools == [("big", 1, ("simple", "deepmet"))]


def test_the_value_types_are_defined_in_the_contract_alone():
    """Four modules had their own `positive`, `non_negative` or names type, with rules that
    disagreed (one took `inf`, one kept the spaces around names)."""
    found = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if any(part.startswith(".") or part in NOT_CODE for part in parts):
            continue
        for node in ast.parse(path.read_text()).body:  # a module's own functions
            if isinstance(node, ast.FunctionDef) and node.name in SHARED:
                found.append(str(path.relative_to(ROOT)))
    assert sorted(set(found)) == ["sonicsite/contract/options.py"]
