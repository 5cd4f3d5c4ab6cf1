"""Every ``tfscache`` command line, ``--set`` key and setting name in docs/*.md (and README.md) is
real.

Issue 33: users copy the docs' commands verbatim. This test runs no server: each command line in
a code block (fenced, or indented four spaces) whose command is ``tfscache SUBCOMMAND`` (also
``.venv/bin/tfscache``, ``python -m tfscache``, after ``VAR=value`` assignments, ``kubectl exec
... --`` or ``docker compose ... exec SERVICE``) is parsed by that subcommand's own parser, found
through ``tfscache.cli.COMMANDS`` (``tfscache node``: its tensorflow_model_server flag parser).
A ``...`` argument stands for "your other flags" and is dropped; a line with another placeholder
is in ALLOWED, with the reason. Inline code spans that start with ``tfscache SUBCOMMAND`` are
often partial (a flag without its value), so only their flag names are checked. Every
``--set KEY=VALUE`` key, key of a TOML snippet, ``section.field`` code span and ``TFSCACHE_*``
variable must be a real setting (or a variable the code or deploy/ reads).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfscache.cli import COMMANDS
from tfscache.importer import import_from_string
from tfscache.settings import iter_fields

ROOT = Path(__file__).resolve().parents[2]
# docs/upstream/ are upstream's texts, not ours; README.md's examples also run (test_readme.py)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTINGS = {dotted for dotted, _ in iter_fields()}
SECTIONS = sorted({d.split(".")[0] for d in SETTINGS if "." in d})

# (page, the command line as written) -> why it cannot be parsed as written
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Line:
    page: str
    lineno: int
    text: str


def code_lines(text: str, page: str) -> list[Line]:
    """The lines of fenced blocks and of blocks indented four spaces, continuations joined."""
    lines, fenced, pending = [], False, None
    for lineno, raw in enumerate(text.splitlines(), 1):
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or raw.startswith("    ")):
            continue
        body = raw.strip()
        if pending is not None:
            body = f"{pending.text} {body}"
            lineno = pending.lineno
        if body.endswith("\\"):
            pending = Line(page, lineno, body[:-1].rstrip())
            continue
        pending = None
        lines.append(Line(page, lineno, body))
    return lines


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell line (split at &&, ||, |, ;, &), comments dropped."""
    text = text.replace("2>&1", "")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: prose, not a command line
        return []
    out, current, redirect = [], [], False
    for token in tokens:
        if redirect or re.fullmatch(r"\d*(>>?|<)", token):  # a redirection and its file
            redirect = not redirect
        elif token and set(token) <= set(";&|"):
            out.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in out + [current] if c]


def tfscache_argv(tokens: list[str]) -> list[str] | None:
    """``[SUBCOMMAND, ARGS...]`` when the command runs tfscache, else None."""
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]  # VAR=value before the command
    if not tokens:
        return None
    if tokens[0] == "kubectl" and "--" in tokens:
        return tfscache_argv(tokens[tokens.index("--") + 1:])
    if tokens[0] == "docker" and "exec" in tokens:
        rest = [t for t in tokens[tokens.index("exec") + 1:]]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        return tfscache_argv(rest[1:])  # rest[0] is the service
    if re.fullmatch(r"(\S*/)?python3?", tokens[0]) and tokens[1:3] == ["-m", "tfscache"]:
        tokens = tokens[2:]
    if re.fullmatch(r"(\S*/)?tfscache", tokens[0]) and len(tokens) > 1 and tokens[1] in COMMANDS:
        return tokens[1:]
    return None


def parser_of(command: str) -> argparse.ArgumentParser | None:
    """The subcommand's own argparse parser (None for ``node``, which has its own flag parser)."""
    target = COMMANDS[command][0]
    module = target.partition(":")[0]
    if command == "node":
        return None
    make = import_from_string(f"{module}:_parser")
    return make(command) if module == "tfscache.cli.admin" else make()


def parse_problem(argv: list[str], capsys) -> str | None:
    """Why the subcommand's parser refuses ``argv`` (None: it accepts it)."""
    command, args = argv[0], [a for a in argv[1:] if a != "..."]
    if command == "node":
        from tfscache.modelserver.main import FlagError, check_flags, parse_flags

        if {"-h", "--help", "-help"} & set(args):
            return None
        try:
            check_flags(parse_flags(args))
        except FlagError as exc:
            return str(exc)
        return None
    try:
        parsed = parser_of(command).parse_args(args)
    except SystemExit as exc:
        out = capsys.readouterr()
        return None if exc.code == 0 else (out.err.strip() or f"exit status {exc.code}")
    for item in getattr(parsed, "set_", []):
        if item.partition("=")[0] not in SETTINGS:
            return f"--set {item}: no such setting"
    return None


def option_names(command: str) -> set[str]:
    if command == "node":
        from tfscache.modelserver.main import FLAGS

        return {f"--{name}" for name in FLAGS} | {"--help", "-help"}
    parser = parser_of(command)
    return {s for action in parser._actions for s in action.option_strings}


def inline_spans(text: str) -> list[tuple[int, str]]:
    spans = []
    for lineno, line in enumerate(text.splitlines(), 1):
        spans += [(lineno, m.group(1)) for m in re.finditer(r"`([^`\n]+)`", line)]
    return spans


def toml_snippets(text: str) -> list[tuple[int, str]]:
    """Fenced ``toml`` blocks, and indented blocks that open with a ``[section]`` header."""
    snippets = [(text[:m.start()].count("\n") + 2, m.group(1))
                for m in re.finditer(r"```toml\n(.*?)```", text, re.S)]
    block: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines() + [""], 1):
        if raw.startswith("    ") and not raw.lstrip().startswith("```"):
            if not block:
                start = lineno
            block.append(raw[4:])
            continue
        if block and re.fullmatch(r"\[[a-z_]+\]", block[0].strip()):
            snippets.append((start, "\n".join(block)))
        block = []
    return snippets


def toml_keys(data: dict) -> list[str]:
    keys = []
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            keys += [f"{key}.{sub}" for sub in value]
        else:
            keys.append(key)
    return keys


def env_names_in_code() -> set[str]:
    """TFSCACHE_* names the package or the deploy files read, and those of every setting."""
    names = {"TFSCACHE_" + d.replace(".", "_").upper() for d in SETTINGS}
    for path in [*(ROOT / "tfscache").rglob("*.py"), *(ROOT / "deploy").rglob("*")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            names |= set(re.findall(r"TFSCACHE_[A-Z0-9_]*[A-Z0-9]", text))
    return names


def package_names(section: str, name: str) -> bool:
    """Whether ``section.name`` names a module or attribute of tfscache.SECTION (the code)."""
    if importlib.util.find_spec(f"tfscache.{section}") is None:
        return False
    package = importlib.import_module(f"tfscache.{section}")
    try:
        module = importlib.util.find_spec(f"tfscache.{section}.{name}")
    except ModuleNotFoundError:  # tfscache.SECTION is a module, not a package
        module = None
    return hasattr(package, name) or module is not None


FILE_SUFFIXES = {"py", "md", "json", "crt", "key", "toml", "yaml", "csv"}


def page_problems(text: str, page: str, capsys, env_names: set[str] | None = None) -> list[str]:
    """Every problem of one page: a refused command line, an unknown flag, setting or variable."""
    problems = []
    for line in code_lines(text, page):
        for tokens in commands(line.text):
            argv = tfscache_argv(tokens)
            if argv is None or (page, line.text) in ALLOWED:
                continue
            problem = parse_problem(argv, capsys)
            if problem:
                problems.append(f"{page}:{line.lineno}: {line.text!r}: {problem}")
    for lineno, span in inline_spans(text):
        for tokens in commands(span):
            argv = tfscache_argv(tokens)
            if argv is None:
                continue
            names = option_names(argv[0])
            for arg in argv[1:]:
                flag = arg.partition("=")[0]
                if flag.startswith("-") and flag not in ("-", "--") and flag not in names:
                    problems.append(f"{page}:{lineno}: `{span}`: tfscache {argv[0]} has no {flag}")
    for m in re.finditer(r"--set[ =]([A-Za-z0-9_.]+)=", text):
        if m.group(1) not in SETTINGS:
            problems.append(f"{page}: --set {m.group(1)}=...: no such setting")
    for lineno, snippet in toml_snippets(text):
        try:
            data = tomllib.loads(snippet)
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"{page}:{lineno}: TOML snippet does not parse: {exc}")
            continue
        problems += [f"{page}:{lineno}: TOML key {k}: no such setting"
                     for k in toml_keys(data) if k not in SETTINGS]
    pattern = re.compile(rf"({'|'.join(SECTIONS)})\.([a-z_][a-z0-9_]*)(\s*=.*)?")
    for lineno, span in inline_spans(text):
        m = pattern.fullmatch(span)
        if m and m.group(2) not in FILE_SUFFIXES and f"{m.group(1)}.{m.group(2)}" not in SETTINGS \
                and not package_names(m.group(1), m.group(2)):
            problems.append(f"{page}:{lineno}: `{span}`: no such setting")
    if env_names is not None:
        for m in re.finditer(r"TFSCACHE_[A-Z0-9_]*[A-Z0-9]\b", text):
            if m.group(0) not in env_names:
                problems.append(f"{page}: {m.group(0)}: no setting or code reads it")
    return problems


def test_every_doc_command_and_setting_is_real(capsys):
    env_names = env_names_in_code()
    problems, seen = [], 0
    for path in DOCS:
        text = path.read_text()
        seen += sum(tfscache_argv(t) is not None
                    for line in code_lines(text, path.name) for t in commands(line.text))
        problems += page_problems(text, path.name, capsys, env_names)
    assert seen >= 30, f"only {seen} tfscache command lines found: is the extraction broken?"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc, expected", [
    ("    tfscache serve --model-repository m --made-up-flag 1\n", "--made-up-flag"),
    ("```\ntfscache simulate log.csv \\\n  --nodes 2 --no-such 3\n```\n", "--no-such"),
    ("    kubectl exec p -c c -- tfscache models --nodes x\n", "--nodes"),
    ("    tfscache node --port=8500 --made_up=1\n", "--made_up"),
    ("Run `tfscache drain --made-up` first.\n", "--made-up"),
    ("    tfscache serve --set cache.no_such=1\n", "cache.no_such"),
    ("```toml\n[cache]\nno_such = 1\n```\n", "cache.no_such"),
    ("Set `ring.no_such = 2`.\n", "ring.no_such"),
    ("    TFSCACHE_CACHE_NO_SUCH=1 tfscache serve\n", "TFSCACHE_CACHE_NO_SUCH"),
])
def test_a_made_up_flag_or_setting_is_caught(doc, expected, capsys):
    problems = page_problems(doc, "made-up.md", capsys, env_names_in_code())
    assert any(expected in p for p in problems), problems


def test_real_lines_pass(capsys):
    doc = ("    tfscache serve --model-repository m --set cache.policy=lru ...\n"
           "    .venv/bin/python -m tfscache simulate log.csv --nodes 1,2 --quiet\n"
           "Run `tfscache node --help` or `tfscache serve --local-nodes`.\n")
    assert page_problems(doc, "real.md", capsys, env_names_in_code()) == []
