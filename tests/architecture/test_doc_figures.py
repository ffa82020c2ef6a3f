"""Figures the documents state that the code or a shipped result decides: how long an
admission pass lasts (the code's epoch), the `small` and `faults` figures of the simulated
results page (docs/sim/*.json, the median over the seeds), and the README's list of seeds
that lose where a median wins. A change to the code or a rerun that leaves the words behind fails
here, naming the sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sonicsite.contract.admission_pass import AdmissionPasses

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "docs" / "sim"
FIGURES = {"p50": "p50", "p99": "p99", "mean": "mean", "makespan": "makespan"}
FIGURES["GPU-hours"] = "gpu_hours"


def _documents() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = " ".join(p.read_text() for p in pages)
    return " ".join(text.split())  # a sentence may be broken across lines anywhere


def _lapse_s(passes: AdmissionPasses, given_at: float) -> float:
    """Seconds after `given_at` at which the pass given then is first refused (1 s steps)."""
    presented = passes.current("m", given_at)
    offset = 0.0
    while passes.admits("m", presented, given_at + offset):
        offset += 1.0
    return offset


def test_the_documented_pass_lapse_is_the_codes():
    passes = AdmissionPasses(b"k" * 16)
    epoch = passes.epoch_s
    shortest = _lapse_s(passes, 10 * epoch + epoch - 1)  # given at an epoch's last second
    longest = _lapse_s(passes, 10 * epoch)  # given as an epoch begins
    said = re.findall(r"a pass lapses (\d+) to (\d+) minutes", _documents())
    assert said, "no document says how long an admission pass lasts"
    for low, high in said:
        assert (int(low), int(high)) == (round(shortest / 60), round(longest / 60)), (
            f"documents say a pass lapses {low} to {high} minutes after its last answer; "
            f"the code's: {shortest:.0f} s to {longest:.0f} s"
        )


def _over(scenario: str, case: str) -> dict:
    result = json.loads((SIM / f"{scenario}.json").read_text())
    return result["summary"]["over_seeds"][case]


def _median(over: dict, figure: str, model: str | None = None) -> str:
    figures = over["per_model"][model] if model else over
    return f"{figures[f'{FIGURES[figure]}_ratio_vs_reference']['median']:.2f}"


def _other_scenarios() -> str:
    text = (SIM / "RESULTS.md").read_text()
    return " ".join(text.split("- other scenarios:", 1)[1].split())


def test_small_figures_are_the_results():
    said = re.search(
        r"`small` p99 ([\d.]+), p50 ([\d.]+) .*?each model's p99 ([\d.]+) \((\w+)\) and "
        r"([\d.]+) \((\w+)\), its mean ([\d.]+) and ([\d.]+), but (\w+)'s p50 ([\d.]+)",
        _other_scenarios(),
    )
    assert said, "docs/sim/RESULTS.md: the `small` sentence is not where it was"
    p99, p50, p99_a, a, p99_b, b, mean_a, mean_b, c, p50_c = said.groups()
    over = _over("small", "fixed_pool")
    a, b, c = a.lower(), b.lower(), c.lower()
    stated = (p99, p50, p99_a, p99_b, mean_a, mean_b, p50_c)
    results = (
        _median(over, "p99"),
        _median(over, "p50"),
        _median(over, "p99", a),
        _median(over, "p99", b),
        _median(over, "mean", a),
        _median(over, "mean", b),
        _median(over, "p50", c),
    )
    assert stated == results, f"docs/sim/RESULTS.md `small`: says {stated}, small.json {results}"


def test_faults_figures_are_the_results():
    said = re.search(
        r"`faults` autoscaled makespan ([\d.]+), p99 ([\d.]+), GPU-hours ([\d.]+), each "
        r"model's p99 ([\d.]+) and ([\d.]+), but (\w+)'s p50 ([\d.]+) .*? its mean ([\d.]+)",
        _other_scenarios(),
    )
    assert said, "docs/sim/RESULTS.md: the `faults` sentence is not where it was"
    makespan, p99, gpu_hours, p99_x, p99_y, model, p50, mean = said.groups()
    over, model = _over("faults", "autoscaled"), model.lower()
    assert (makespan, p99, gpu_hours) == tuple(
        _median(over, f) for f in ("makespan", "p99", "GPU-hours")
    )
    assert sorted((p99_x, p99_y)) == sorted(_median(over, "p99", m) for m in over["per_model"])
    assert (p50, mean) == (_median(over, "p50", model), _median(over, "mean", model))


def losing_seeds() -> set[tuple[str, str, str, str, int]]:
    """(scenario, case, model or "", figure, seed) wherever a figure's median over the seeds
    wins (under 1) and that seed's is over 1."""
    found = set()
    for path in sorted(SIM.glob("*.json")):
        summary = json.loads(path.read_text())["summary"]
        for case, over in summary["over_seeds"].items():
            tables = [("", over), *sorted(over["per_model"].items())]
            for model, figures in tables:
                for figure, key in FIGURES.items():
                    values = figures.get(f"{key}_ratio_vs_reference")
                    if not values or values["median"] >= 1:
                        continue
                    for seed, value in zip(summary["seeds"], values["values"], strict=True):
                        if value > 1:
                            found.add((path.stem, case, model, figure, seed))
    return found


def said_losing_seeds(note: str) -> set[tuple[str, str, str, str, int]]:
    said = set()
    for entry in note.split("; "):
        head = re.match(r"`([\w-]+)` (fixed pool|autoscaled): (.*)", entry)
        assert head, f"README: {entry!r} names no scenario and comparison"
        scenario, case, items = head.groups()
        for item in items.rstrip(".").split(", "):
            one = re.fullmatch(r"(?:(\w+)'s )?(\S+) on seeds? ([\d ,and]+)", item)
            assert one, f"README: {item!r} is not 'MODEL's FIGURE on seed N'"
            model, figure, seeds = one.groups()
            for seed in re.findall(r"\d+", seeds):
                key = (scenario, case.replace(" ", "_"), (model or "").lower(), figure)
                said.add((*key, int(seed)))
    return said


def test_the_readme_names_every_seed_that_loses_where_the_median_wins():
    text = (ROOT / "README.md").read_text()
    lead = "A median under 1 can hide a seed that loses"
    assert lead in text, "README: the list of losing seeds is gone"
    paragraph = " ".join(text.split(lead, 1)[1].split("\n\n", 1)[0].split())
    note = paragraph.split("show): ", 1)[1]
    assert said_losing_seeds(note) == losing_seeds()
