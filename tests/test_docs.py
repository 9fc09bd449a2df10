"""Every command the README and the manual (docs/) show is checked against the code, without running anything.

A command is a line of a shell code block (```bash, ```sh, ```console or a block without a language), or an inline
code span that starts with ``nox``, ``python -m fsdp_matrix``, ``torchrun``, ``accelerate launch`` or runs a file of
tests/. For each:

- ``python -m fsdp_matrix SUB ARGS``: SUB exists, ``SUB ARGS --help`` parses (the argv goes through the command's own
  parser up to ``--help``) and every flag of ARGS is in that help;
- ``nox -s NAME`` / ``nox -t TAG``: the session (or ``name(combo)``) is in noxfile.py, the tag on some combo; what
  follows ``--`` is checked as the session hands it on (to ``fsdp_matrix bisect``/``upgrade``, or to pytest);
- ``torchrun``/``accelerate launch`` of a repro: the files exist and ``--cell`` names a cell of the repro's case;
- every ``--combo``, ``--cases`` and ``CASE/CELL`` argument names a combo, case or cell of matrix.yaml.

Placeholders (upper-case words such as CELL or ID, ``<name>``, the example case ``my-bug``) are not looked up.
"""

from __future__ import annotations

import ast
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from fsdp_matrix import cli
from fsdp_matrix.cells import expand
from fsdp_matrix.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
EXAMPLE_CASE = "my-bug"
"""The README's example case: its ids are not in matrix.yaml (tests/test_readme.py checks the example itself)."""


def _blocks(text: str) -> List[Tuple[str, str]]:
    """(language, body) of every fenced code block, indented ones (inside a list item) included."""
    found = re.findall(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", text, re.M | re.S)
    return [(lang, re.sub(rf"^{indent}", "", body, flags=re.M)) for indent, lang, body in found]


def _commands(text: str) -> List[str]:
    commands = []
    for lang, body in _blocks(text):
        if lang in SHELL_BLOCKS:
            joined = re.sub(r"\\\n\s*", " ", body)
            commands += [line.strip() for line in joined.splitlines() if line.strip()]
    outside = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.M | re.S)
    for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", outside.replace("\n", " ")):
        if re.match(r"(nox -|python -m fsdp_matrix |python tests/|pytest tests/|torchrun |accelerate launch )", span):
            commands.append(span)
    return commands


def _all_commands() -> List[Tuple[str, str]]:
    seen: Dict[str, str] = {}
    for page in PAGES:
        for command in _commands(page.read_text()):
            seen.setdefault(command, str(page.relative_to(ROOT)))
    return sorted((where, command) for command, where in seen.items())


COMMANDS = _all_commands()


def _words(command: str) -> List[List[str]]:
    """The simple commands of a line (split at ``&&``, ``|``, ``;``), comments and ``VAR=value`` prefixes dropped,
    a usage's ``[--opt X]`` brackets and ``a|b`` alternatives reduced to one spelling."""
    # `auto|always|never` (no spaces) is a usage's choice of values, not a pipe: keep its first spelling
    command = re.sub(r"(?<=[\w.-])\|[\w.|-]+", "", command)
    lexer = shlex.shlex(command, posix=True, punctuation_chars="&|;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    parts: List[List[str]] = [[]]
    for token in lexer:
        if token in ("&&", "|", ";", "||"):
            parts.append([])
        elif not (not parts[-1] and re.fullmatch(r"[A-Z_]+=\S*", token)):
            parts[-1].append(token)
    cleaned = []
    for part in parts:
        words = [w.strip("[]") for w in part]
        cleaned.append([w for w in words if w and w != "..."])
    return [p for p in cleaned if p]


def _placeholder(word: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", word)) or "<" in word or "$" in word or EXAMPLE_CASE in word


@cache
def _cell_ids() -> Set[str]:
    ids = set()
    for device in ("cpu", "cuda"):
        for world_size, nodes in ((2, 1), (1, 1), (2, 2)):
            ids |= {f"{c.case}/{c.id}" for c in expand(MATRIX, device, world_size, nodes=nodes)}
    return ids


def _check_values(words: List[str]) -> None:
    combos = {c.id for c in MATRIX.combos}
    cases = {c.id for c in MATRIX.cases}
    for flag, value in zip(words, words[1:]):
        if _placeholder(value):
            continue
        if flag == "--combo":
            assert value in combos, f"--combo {value}: no such combo in matrix.yaml"
        if flag == "--cases":
            assert set(value.split(",")) <= cases, f"--cases {value}: no such case in matrix.yaml"
    for word in words:
        if re.fullmatch(r"[a-z0-9-]+/[a-z0-9_.-]+-ws\d+(-n\d+)?", word) and not _placeholder(word):
            assert word in _cell_ids(), f"{word}: no such cell in matrix.yaml"


def _flags(words: List[str]) -> List[str]:
    # a quoted value with spaces ("--nnodes=2 --node-rank=N ...") is the value of the option before it
    return [w.split("=")[0] for w in words if w.startswith("-") and w != "-" and " " not in w]


def _check_fsdp_matrix(words: List[str], capsys) -> None:
    """``python -m fsdp_matrix SUB ARGS``: SUB ARGS --help parses, and every flag is in the help it prints."""
    assert words, "python -m fsdp_matrix without a command"
    sub, args = words[0], words[1:]
    assert sub in cli.COMMANDS, f"python -m fsdp_matrix {sub}: no such command (cli.COMMANDS)"
    capsys.readouterr()
    with pytest.raises(SystemExit) as leaves:
        cli.main([sub, *args, "--help"])
    out, err = capsys.readouterr()
    assert leaves.value.code == 0, f"fsdp_matrix {sub} {' '.join(args)} --help: exit {leaves.value.code}: {err}"
    for flag in _flags(args):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), f"fsdp_matrix {sub}: no {flag} in its --help"
    _check_values(args)


@cache
def _noxfile() -> Tuple[Set[str], Set[str]]:
    """The session names of noxfile.py, and the flags of the option parser its sessions read (``--pre``, ``--pin``:
    fsdp_matrix/sessions.py)."""
    from fsdp_matrix import sessions as nox_sessions

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("nox.session" in ast.unparse(d) for d in node.decorator_list):
            sessions.add(node.name)
    flags = {flag for action in nox_sessions.parser()._actions for flag in action.option_strings}
    return sessions, flags


def _check_session(name: str) -> str:
    sessions, _ = _noxfile()
    match = re.fullmatch(r"([a-z_]+)(?:\((.+)\))?", name)
    assert match and match.group(1) in sessions, f"nox -s {name}: no such session in noxfile.py"
    base, combo = match.groups()
    if combo:
        specs = [c for c in MATRIX.combos if c.id == combo]
        assert specs, f"nox -s {name}: no combo {combo} in matrix.yaml"
        runs = "tests" in specs[0].tags if base == "tests" else specs[0].session == base
        assert runs, f"nox -s {name}: combo {combo} is not one of {base}'s"
    return base


def _check_nox(words: List[str], capsys, pytestconfig) -> None:
    head, posargs = (words[: words.index("--")], words[words.index("--") + 1 :]) if "--" in words else (words, [])
    names, i = [], 0
    while i < len(head):
        word = head[i]
        if word == "-s":
            i += 1
            while i < len(head) and not head[i].startswith("-"):
                names.append(_check_session(head[i]))
                i += 1
            continue
        if word == "-t":
            tag = head[i + 1]
            assert any(tag in c.tags for c in MATRIX.combos), f"nox -t {tag}: no combo has that tag"
            i += 2
            continue
        assert word in ("-l", "--json", "--list"), f"nox {word}: an option this test does not know"
        i += 1
    if names and names[0] in ("bisect", "upgrade", "gate", "device"):
        _check_fsdp_matrix([names[0], *posargs], capsys)
        return
    _, own = _noxfile()
    _check_pytest_flags([w for w in posargs if w.split("=")[0] not in own], pytestconfig)


def _check_pytest_flags(args: List[str], pytestconfig) -> None:
    """Options handed to pytest: each is declared by pytest or a plugin of this run (the matrix plugin's --cases...)."""
    for flag in _flags(args):
        dest = {"-k": "keyword", "-m": "markexpr", "-x": "exitfirst", "-n": "numprocesses", "-p": "plugins"}.get(flag)
        dest = {"--junitxml": "xmlpath", "--junit-xml": "xmlpath"}.get(flag, dest)
        pytestconfig.getoption(dest or flag.lstrip("-").replace("-", "_"))  # ValueError: pytest has no such option
    _check_values(args)


def _check_launch(words: List[str]) -> None:
    """``torchrun ... repros/X.py --cell ID`` or ``accelerate launch --config_file F repros/X.py --cell ID``."""
    paths = [w for w in words if re.fullmatch(r"(repros|tests)/[\w/.-]+\.(py|yaml)", w)]
    for path in paths:
        assert (ROOT / path).is_file(), f"{path}: no such file"
    repros = [p for p in paths if p.startswith("repros/")]
    if "--cell" in words and repros:
        cell = words[words.index("--cell") + 1]
        case = next(c.id for c in MATRIX.cases if c.repro == repros[0])
        assert f"{case}/{cell}" in _cell_ids(), f"{repros[0]} --cell {cell}: no such cell of {case}"


def _check_run_sh(args: List[str]) -> None:
    """``bash DIR/run.sh ARGS`` (a prepared device run): every flag is one of run.sh's own."""
    script = (ROOT / "fsdp_matrix" / "device" / "run.sh").read_text()
    known = set(re.findall(r"^\s+(--[a-z-]+)(?:\|-h)?\)", script, re.M))
    for flag in _flags(args):
        assert flag in known, f"run.sh {flag}: not an option of fsdp_matrix/device/run.sh ({', '.join(sorted(known))})"


def _check_words(words: List[str], capsys, pytestconfig) -> None:
    program, rest = words[0], words[1:]
    if program == "nox":
        return _check_nox(rest, capsys, pytestconfig)
    if program == "python" and rest[:2] == ["-m", "fsdp_matrix"]:
        return _check_fsdp_matrix(rest[2:], capsys)
    if program == "python" and rest[:2] == ["-m", "pip"]:
        return None
    if program in ("torchrun", "accelerate"):
        return _check_launch(rest)
    if program == "pytest" and rest[:2] == ["--pyargs", "fsdp_matrix.suite"]:  # the suite, as upstream runs it
        return _check_pytest_flags(rest[2:], pytestconfig)
    if program == "bash" and rest and rest[0].endswith("/run.sh"):
        return _check_run_sh(rest[1:])
    if program in ("python", "pytest") and rest and rest[0].endswith(".py"):
        assert (ROOT / rest[0]).is_file(), f"{rest[0]}: no such file"
        if program == "pytest":
            _check_pytest_flags(rest[1:], pytestconfig)
        return None
    assert program == "pbpaste", f"{' '.join(words)}: a program this test does not know how to check"
    return None


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_command_is_real(where, command, capsys, pytestconfig):
    for words in _words(command):
        _check_words(words, capsys, pytestconfig)


def test_commands_are_found():
    # the extraction itself: a README without its two commands, or a docs tree read as empty, fails here
    assert len({where for where, _ in COMMANDS}) >= 10
    assert any(c.startswith("python -m pip install 'nox[uv]' && nox -s tests ") for _, c in COMMANDS)


@pytest.mark.parametrize(
    "command,why",
    [
        ("python -m fsdp_matrix explian CELL", "no such command"),
        ("python -m fsdp_matrix explain CELL --combination torch2.6", "no --combination in its --help"),
        ("python -m fsdp_matrix report DIR --format pdf", "exit 2"),
        ("python -m fsdp_matrix explain CELL --combo torch9.9", "no such combo"),
        ("python -m fsdp_matrix explain lora-requires-grad/no-such-cell-ws2", "no such cell"),
        ("nox -s matrixx", "no such session"),
        ('nox -s "matrix(no-such-combo)"', "no combo no-such-combo"),
        ('nox -s "torch(old)"', "is not one of torch's"),
        ("nox -t gpus", "no combo has that tag"),
        ("nox -s matrix -- --no-such-option", "no option named"),
        ("nox -s matrix -- --cases no-such-case", "no such case"),
        ("nox -s upgrade -- peft==0.14.0 --no-such-option", "no --no-such-option in its --help"),
        ("torchrun --nproc-per-node 2 repros/dora_sharded_weight.py --cell no-such-cell-ws2", "no such cell"),
        ("torchrun --nproc-per-node 2 repros/no_such_repro.py", "no such file"),
        ("make docs", "does not know how to check"),
        ("nox -s device -- --prepare .device --no-such-option", "no --no-such-option in its --help"),
        ("bash .device/run.sh --rehearse --no-such-option", "not an option of fsdp_matrix/device/run.sh"),
    ],
)
def test_a_wrong_command_fails(command, why, capsys, pytestconfig):
    # ValueError: pytest's getoption, for an option no plugin declares
    with pytest.raises((AssertionError, ValueError), match=re.escape(why)):
        for words in _words(command):
            _check_words(words, capsys, pytestconfig)


def _imports_of_fsdp_matrix(source: str) -> List[ast.stmt]:
    """The import statements of a Python snippet that import fsdp_matrix (anywhere in it, a function's body too)."""

    def ours(module: str) -> bool:
        return module == "fsdp_matrix" or module.startswith("fsdp_matrix.")

    return [
        node
        for node in ast.walk(ast.parse(source))
        if (isinstance(node, ast.Import) and any(ours(a.name) for a in node.names))
        or (isinstance(node, ast.ImportFrom) and ours(node.module or ""))
    ]


SNIPPETS = [
    (str(page.relative_to(ROOT)), body)
    for page in PAGES
    for lang, body in _blocks(page.read_text())
    if lang in ("python", "py") and "fsdp_matrix" in body
]


@pytest.mark.parametrize("where,snippet", SNIPPETS, ids=[f"{w}:{s.splitlines()[0][:50]}" for w, s in SNIPPETS])
def test_a_snippets_imports_of_fsdp_matrix_run(where, snippet):
    # adding-a-case.md imported `main` from fsdp_matrix.standalone while the README said fsdp_matrix.case
    imports = _imports_of_fsdp_matrix(snippet)
    assert imports, f"{where}: a snippet that names fsdp_matrix without importing it"
    exec(compile(ast.Module(body=imports, type_ignores=[]), where, "exec"), {})  # ImportError: the snippet lies
    repro_like = any(sign in snippet for sign in ("def run(params", "__main__", "CASE ="))
    outside = [ast.unparse(n) for n in imports if isinstance(n, ast.ImportFrom) and n.module != "fsdp_matrix.case"]
    assert not (repro_like and outside), f"{where}: a repro imports harness code only from fsdp_matrix.case: {outside}"


def test_the_snippets_are_found():
    assert any(w == "README.md" for w, _ in SNIPPETS) and len(SNIPPETS) >= 3


LAYOUT = ROOT / "docs" / "pages" / "layout.md"


def _layout_rows() -> List[Tuple[str, str]]:
    return re.findall(r"^\| `([^`]+)` \| (.+) \|$", LAYOUT.read_text(), re.M)


@pytest.mark.parametrize("path,what", _layout_rows(), ids=[p for p, _ in _layout_rows()])
def test_layout_names_only_what_is_in_the_tree(path, what):
    # layout.md listed 7 export modules that no longer existed
    assert (ROOT / path).exists(), f"layout.md: {path} does not exist"
    if path.startswith("fsdp_matrix/") and path.endswith("/"):
        named = set(re.findall(r"`([a-z_][a-z0-9_]*)`", what))
        missing = sorted(n for n in named if not (ROOT / path / f"{n}.py").is_file() and not (ROOT / path / n).is_dir())
        assert not missing, f"layout.md: {path} has no module {missing} (a backticked word there names a module)"


def test_layout_names_every_subpackage():
    rows = {p for p, _ in _layout_rows()}
    packages = {f"fsdp_matrix/{p.name}/" for p in (ROOT / "fsdp_matrix").iterdir() if (p / "__init__.py").is_file()}
    assert sorted(packages - rows) == [], "layout.md: add a row for each subpackage"
