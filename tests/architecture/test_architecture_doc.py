"""The documents send a reader to places that exist: every `file.py` `Symbol` pair that
ARCHITECTURE.md names is defined in that file (read by its AST: a re-export, or a symbol of the
file beside it, is not where the code is), every `.md` document a document names is one of
the repository's, and every relative Markdown link resolves. A clone's reader has only the
repository, so a pointer outside it, or to code that moved, fails here."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
TOKEN = re.compile(r"`([^`]+)`")
SYMBOL = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)?")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a backticked word after a file that is not code of that file: (file, word, why)
PROSE = {
    ("sonicsite/contract/wire.py", "status", "the command `sonicsite status`"),
    ("sonicsite/contract/wire.py", "holding", "a key of /v1/state's JSON"),
    ("operator/api.py", "declared_work", "a key of /v1/state's JSON"),
}


@dataclass
class Definitions:
    """What one module defines: every name bound anywhere (functions, classes, assignments,
    `self.x =`), and each class's members."""

    names: set[str] = field(default_factory=set)
    members: dict[str, set[str]] = field(default_factory=dict)


def _targets(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = []
    for t in targets:
        for leaf in ast.walk(t):
            if isinstance(leaf, ast.Name):
                names.append(leaf.id)
            elif (
                isinstance(leaf, ast.Attribute)
                and isinstance(leaf.value, ast.Name)
                and leaf.value.id in ("self", "cls")
            ):
                names.append(leaf.attr)
    return names


def _bound(node: ast.AST) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        return _targets(node)
    return []


@functools.cache
def definitions(path: Path) -> Definitions:
    tree = ast.parse(path.read_text(), str(path))
    found = Definitions()
    for node in ast.walk(tree):
        found.names.update(_bound(node))
        if isinstance(node, ast.ClassDef):
            members = found.members.setdefault(node.name, set())
            for inner in ast.walk(node):
                if inner is not node:
                    members.update(_bound(inner))
    return found


def _resolve(token: str, last: Path | None, room: Path | None) -> Path | None:
    """A file named from the root, beside the last file named, or in the row's room."""
    for base in (ROOT, last.parent if last else None, room):
        if base is not None and (base / token).is_file():
            return base / token
    return None


def _defines(path: Path, symbol: str) -> bool:
    owner, _, member = symbol.rpartition(".")
    found = definitions(path)
    if not owner:
        return symbol in found.names
    if owner in found.members:
        return member in found.members[owner]
    beside = path.parent / f"{owner}.py"  # `module.name` of a module beside the file
    return beside.is_file() and member in definitions(beside).names


def _is_path(token: str) -> bool:
    return "/" in token or " " in token or re.search(r"\.[a-z]{2,5}$", token) is not None


def named_pairs(text: str) -> list[tuple[int, str, str]]:
    """(line, file, symbol) for each `file.py` `Symbol` in the same table cell segment (a
    cell split at `;`); a symbol belongs to the last file named before it. A word followed by
    's is prose (`up`'s options), not a symbol."""
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            continue
        first = TOKEN.search(line)  # the rooms table's rows begin with their folder
        room = ROOT / first.group(1) if first and first.group(1).endswith("/") else None
        for segment in re.split(r"[|;]", line):
            last: Path | None = None
            for match in TOKEN.finditer(segment):
                token = match.group(1)
                if token.endswith(".py"):
                    last = _resolve(token, last, room)
                    if last is None:
                        pairs.append((number, token, ""))
                    continue
                if _is_path(token):
                    last = None
                    continue
                possessive = segment[match.end() : match.end() + 2] == "'s"
                if last is None or possessive or token.startswith("sonicsite"):
                    continue
                if SYMBOL.fullmatch(token):
                    pairs.append((number, str(last.relative_to(ROOT)), token))
    return pairs


def test_named_symbols_exist():
    prose = {(f, w) for f, w, _ in PROSE}
    pairs = named_pairs(ARCHITECTURE.read_text())
    assert len(pairs) > 100, "the policy table's pairs were not found"
    wrong = [
        f"ARCHITECTURE.md:{n}: `{f}` " + (f"defines no `{s}`" if s else "is no file")
        for n, f, s in pairs
        if (f, s) not in prose and (not s or not _defines(ROOT / f, s))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checker_catches_a_symbol_of_another_file():
    """The check itself: a re-export and a method that is nowhere are both caught."""
    text = (
        "| a | `operator/placement.py` `waiting_reasons` |\n"
        "| b | `operator/controller.py` `Operator._autoscale`, `_actuate` |\n"
        "| c | `operator/placement_state.py` `waiting_reasons`; `operator/xds_routes.py` |\n"
    )
    pairs = named_pairs(text)
    assert [(f, s) for _, f, s in pairs if not _defines(ROOT / f, s)] == [
        ("operator/placement.py", "waiting_reasons"),
        ("operator/controller.py", "_actuate"),
    ]


@functools.cache
def repository_files() -> frozenset[str]:
    """Tracked files and new ones not ignored (a document written but not committed yet)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return frozenset(out.stdout.splitlines())


def documents() -> list[Path]:
    return sorted(ROOT / p for p in repository_files() if p.endswith(".md"))


def _in_repository(target: Path) -> bool:
    try:
        relative = target.resolve().relative_to(ROOT)
    except ValueError:
        return False
    files = repository_files()
    return str(relative) in files or any(f.startswith(f"{relative}/") for f in files)


def test_named_documents_exist():
    """Every backticked `*.md` in a document is a file of the repository, from its root or
    from the document's own folder."""
    wrong = []
    for doc in documents():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for token in TOKEN.findall(line):
                if not re.fullmatch(r"[\w./-]+\.md", token):
                    continue
                where = (ROOT / token, doc.parent / token)
                if not any(_in_repository(p) and p.is_file() for p in where):
                    wrong.append(f"{doc.relative_to(ROOT)}:{number}: `{token}` is not in the repo")
    assert not wrong, "\n".join(wrong)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_links_resolve():
    """Every relative link of every document goes to a file or folder of the repository, and
    to a heading of it where the link names one."""
    wrong = []
    for doc in documents():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                name, _, anchor = target.partition("#")
                path = (doc.parent / name).resolve() if name else doc
                where = f"{doc.relative_to(ROOT)}:{number}: ({target})"
                if not (path.exists() and _in_repository(path)):
                    wrong.append(f"{where} resolves nowhere")
                elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                    wrong.append(f"{where}: no heading #{anchor} in {path.name}")
    assert not wrong, "\n".join(wrong)
