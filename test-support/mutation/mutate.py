#!/usr/bin/env python3
"""Mutation testing for leasehold's SQL functions.

Mutates the functions of migrations/*/up.sql and sql/functions/*.sql one operator at a time and runs
the SQL-level test suite (the cargo test target `leasehold`) against each
mutant. A mutant is applied by test-support after `leasehold::install`, via
LEASEHOLD_TEST_SQL_PATCH (a file holding one `CREATE OR REPLACE FUNCTION`).
See README.md next to this file. Python 3.11, standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCH_ENV = "LEASEHOLD_TEST_SQL_PATCH"
PATCH_FAILURE_MARK = PATCH_ENV + ": applying"
COVERAGE_ENV = "LEASEHOLD_TEST_FUNCTION_COVERAGE"
TEST_TARGET = "leasehold"

OPERATORS = {
    "cmp": "comparison flip: < <=, <= <, > >=, >= >, = <>, <> =, != =",
    "and_or": "AND <-> OR",
    "row_lock": "drop FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE [OF ..] [NOWAIT | SKIP LOCKED]",
    "clock": "clock_timestamp() -> now()",
    "security_definer": "drop SECURITY DEFINER",
    "search_path": "drop the SET search_path = ... clause",
    "is_null": "IS NULL <-> IS NOT NULL",
    "greatest_least": "GREATEST <-> LEAST",
    "plus_one": "+ 1 -> + 0",
}
CMP_FLIPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "=": "<>", "<>": "=", "!=": "="}
OP_CHARS = set("+-*/<>=~!@#%^&|`?")
RAISE_OPTIONS = {"errcode", "message", "detail", "hint", "constraint", "column",
                 "datatype", "table", "schema"}
SET_LIST_ENDS = {"where", "from", "returning"}
HEADER_CLAUSES = {"language", "as", "security", "external", "stable", "immutable",
                  "volatile", "parallel", "strict", "called", "returns", "cost",
                  "rows", "support", "set", "leakproof", "not", "window", "transform"}


# --------------------------------------------------------------------------
# Lexing


@dataclasses.dataclass
class Token:
    """One lexical token: kind, span [start, end) in the lexed text, text."""

    kind: str  # word, number, param, op, punct, string, qident, dollar, comment
    start: int
    end: int
    text: str

    @property
    def low(self) -> str:
        """The text in lower case (keywords compare case-insensitively)."""
        return self.text.lower()


WORD_RE = re.compile(r"[A-Za-z_\x80-\uffff][A-Za-z0-9_$\x80-\uffff]*")
NUMBER_RE = re.compile(r"\d+(?:\.(?!\.)\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?")
DOLLAR_RE = re.compile(r"\$([A-Za-z_\x80-\uffff][A-Za-z0-9_\x80-\uffff]*)?\$")
PARAM_RE = re.compile(r"\$\d+")


def quoted_end(text: str, pos: int, quote: str, backslash: bool = False) -> int:
    """End (exclusive) of the quoted literal opening at text[pos]."""
    i = pos + 1
    while i < len(text):
        c = text[i]
        if backslash and c == "\\":
            i += 2
            continue
        if c == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    raise ValueError(f"unterminated {quote} literal at offset {pos}")


def block_comment_end(text: str, pos: int) -> int:
    """End (exclusive) of the /* */ comment opening at pos (they nest)."""
    depth, i = 0, pos
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise ValueError(f"unterminated comment at offset {pos}")


def operator_end(text: str, pos: int, end: int) -> int:
    """End of the operator at pos, by PostgreSQL's rules for operator runs."""
    i = pos
    while i < end and text[i] in OP_CHARS:
        if i > pos and (text.startswith("--", i) or text.startswith("/*", i)):
            break
        i += 1
    run = text[pos:i]
    while len(run) > 1 and run[-1] in "+-" and not set(run) & set("~!@#%^&|`?"):
        run = run[:-1]
    return pos + len(run)


def next_token(text: str, pos: int, end: int) -> Token:
    """The token starting at pos (which is not whitespace)."""
    c = text[pos]
    if text.startswith("--", pos):
        stop = text.find("\n", pos)
        stop = end if stop < 0 or stop > end else stop
        return Token("comment", pos, stop, text[pos:stop])
    if text.startswith("/*", pos):
        stop = block_comment_end(text, pos)
        return Token("comment", pos, stop, text[pos:stop])
    if c == "'":
        stop = quoted_end(text, pos, "'")
        return Token("string", pos, stop, text[pos:stop])
    if c == '"':
        stop = quoted_end(text, pos, '"')
        return Token("qident", pos, stop, text[pos:stop])
    if c == "$":
        if m := PARAM_RE.match(text, pos):
            return Token("param", pos, m.end(), m.group())
        if m := DOLLAR_RE.match(text, pos):
            close = text.find(m.group(), m.end())
            if close < 0:
                raise ValueError(f"unterminated dollar quote at offset {pos}")
            stop = close + len(m.group())
            return Token("dollar", pos, stop, text[pos:stop])
    if c in "eE" and text.startswith("'", pos + 1):
        stop = quoted_end(text, pos + 1, "'", backslash=True)
        return Token("string", pos, stop, text[pos:stop])
    if m := WORD_RE.match(text, pos):
        return Token("word", pos, m.end(), m.group())
    if m := NUMBER_RE.match(text, pos):
        return Token("number", pos, m.end(), m.group())
    if text.startswith(":=", pos) or text.startswith("::", pos):
        return Token("punct", pos, pos + 2, text[pos:pos + 2])
    if c in OP_CHARS:
        stop = operator_end(text, pos, end)
        return Token("op", pos, stop, text[pos:stop])
    return Token("punct", pos, pos + 1, c)


def lex(text: str, start: int = 0, end: int | None = None) -> list[Token]:
    """All tokens of text[start:end], comments included, whitespace left out."""
    end = len(text) if end is None else end
    tokens, pos = [], start
    while pos < end:
        if text[pos].isspace():
            pos += 1
            continue
        token = next_token(text, pos, end)
        tokens.append(token)
        pos = token.end
    return tokens


def code(tokens: list[Token]) -> list[Token]:
    """The tokens that are code: no comments (strings stay, as opaque tokens)."""
    return [t for t in tokens if t.kind != "comment"]


# --------------------------------------------------------------------------
# Parsing the functions


@dataclasses.dataclass
class Function:
    """One `CREATE [OR REPLACE] FUNCTION ... $$ ... $$;` statement."""

    name: str
    args: str
    file: Path
    line: int  # line of CREATE in the file
    text: str  # the statement, CREATE .. ;
    body: Token  # the dollar-quoted body, offsets within text
    label: str = ""

    def file_line(self, offset: int) -> int:
        """The file line of an offset within the statement text."""
        return self.line + self.text.count("\n", 0, offset)

    @property
    def arity(self) -> int:
        """How many arguments the signature lists."""
        return len(split_top_level(self.args)) if self.args.strip() else 0


def split_top_level(text: str) -> list[str]:
    """text split at the commas outside parentheses."""
    parts, depth, current = [], 0, []
    for c in text:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    parts.append("".join(current))
    return parts


def statements(text: str) -> list[tuple[int, int, list[Token]]]:
    """The top-level statements of a file: (start, end incl. ';', tokens)."""
    result, current = [], []
    for token in lex(text):
        if token.kind == "comment":
            continue
        current.append(token)
        if token.kind == "punct" and token.text == ";":
            result.append((current[0].start, token.end, current))
            current = []
    if current:
        result.append((current[0].start, current[-1].end, current))
    return result


def is_create_function(tokens: list[Token]) -> bool:
    """Whether a statement starts CREATE [OR REPLACE] FUNCTION."""
    words = [t.low for t in tokens[:4]]
    return words[:2] == ["create", "function"] or words[:4] == ["create", "or", "replace", "function"]


def signature(tokens: list[Token], text: str) -> tuple[str, str]:
    """The function's name and its argument list text (inside the parens)."""
    i = [t.low for t in tokens].index("function") + 1
    name_parts = []
    while tokens[i].text != "(":
        name_parts.append(tokens[i].text)
        i += 1
    depth, open_at = 0, tokens[i].end
    for token in tokens[i:]:
        depth += token.text == "("
        depth -= token.text == ")"
        if depth == 0:
            return "".join(name_parts), text[open_at:token.start]
    raise ValueError("unbalanced parentheses in a function signature")


def parse_file(path: Path) -> list[Function]:
    """Every CREATE FUNCTION statement of one file that has a dollar-quoted body."""
    text = path.read_text()
    functions = []
    for start, end, tokens in statements(text):
        if not is_create_function(tokens):
            continue
        bodies = [t for t in tokens if t.kind == "dollar"]
        if not bodies:
            continue
        name, args = signature(tokens, text)
        body = bodies[0]
        functions.append(Function(
            name=name, args=" ".join(args.split()), file=path,
            line=text.count("\n", 0, start) + 1, text=text[start:end],
            body=Token("dollar", body.start - start, body.end - start, body.text)))
    return functions


def migration_files(repo: Path) -> list[Path]:
    """migrations/*/up.sql, sorted, then sql/functions/*.sql, sorted: the
    order every install applies them in."""
    return sorted(repo.glob("migrations/*/up.sql")) + sorted(repo.glob("sql/functions/*.sql"))


def parse_functions(files: list[Path]) -> tuple[list[Function], list[Function]]:
    """The functions as finally installed, and the definitions later ones replace.

    A function defined again later (same name and argument list) is installed
    as its last definition, so only that one is mutated: re-creating an
    earlier one would also revert the later change.
    """
    latest: dict[tuple[str, str], Function] = {}
    superseded = []
    for path in files:
        for function in parse_file(path):
            key = (function.name.lower(), function.args.lower())
            if key in latest:
                superseded.append(latest[key])
            latest[key] = function
    functions = list(latest.values())
    label_functions(functions)
    return functions, superseded


# The operators that change a function's header, not its body.
HEADER_OPERATORS = ("security_definer", "search_path")


def install_only(files: list[Path], functions: list[Function]) -> list[Function]:
    """The functions only the migrations themselves call, while they install.

    A mutant is applied after install (LEASEHOLD_TEST_SQL_PATCH), so a
    function that runs only from a top-level `SELECT` of a migration (such as
    lease._drop_default_grants, which every migration ends with) and from no
    function body has already done its work when the mutant replaces it: no
    test can notice. Such mutants are left out, and --list names the
    functions; the extension suite (tests/extension) and tests/leasehold's
    install tests check what those functions leave behind.
    """
    calls = []
    for path in files:
        text = path.read_text()
        for _, _, tokens in statements(text):
            if tokens and tokens[0].low == "select":
                calls.append("".join(t.text.lower() for t in tokens))
    top_level = "\n".join(calls)
    result = []
    for function in functions:
        name = re.escape(function.name.lower())
        if not re.search(name + r"\s*\(", top_level):
            continue
        others = " ".join(f.body.text.lower() for f in functions if f is not function)
        if not re.search(name + r"\b", others):
            result.append(function)
    return result


def label_functions(functions: list[Function]) -> None:
    """Names for reports: the name, with /arity when it is overloaded."""
    counts: dict[str, int] = {}
    for function in functions:
        counts[function.name] = counts.get(function.name, 0) + 1
    for function in functions:
        overloaded = counts[function.name] > 1
        function.label = f"{function.name}/{function.arity}" if overloaded else function.name


# --------------------------------------------------------------------------
# Mutation sites


@dataclasses.dataclass
class Site:
    """One mutation: replace statement text [start, end) with `replacement`."""

    operator: str
    start: int
    end: int
    replacement: str


def body_tokens(function: Function) -> list[Token]:
    """The code tokens of the function body (nested dollar quotes stay opaque)."""
    tag_len = function.body.text.index("$", 1) + 1
    start, end = function.body.start + tag_len, function.body.end - tag_len
    return code(lex(function.text, start, end))


def header_tokens(function: Function) -> list[Token]:
    """The code tokens of the statement outside the body."""
    tokens = code(lex(function.text))
    return [t for t in tokens if t.start != function.body.start]


def assignment_equals(tokens: list[Token]) -> set[int]:
    """Indexes of `=` tokens that assign rather than compare.

    UPDATE/INSERT ... SET lists and SET statements, RAISE ... USING options
    and GET DIAGNOSTICS items: flipping those only gives a syntax error.
    """
    skip: set[int] = set()
    depth, set_depth, expect = 0, None, False
    statement_words: list[str] = []
    for i, token in enumerate(tokens):
        low = token.low
        if token.text == ";":
            set_depth, expect, statement_words = None, False, []
            continue
        if token.kind == "word":
            statement_words.append(low)
        if token.text in "([":
            depth += 1
        elif token.text in ")]":
            depth -= 1
            if set_depth is not None and depth < set_depth:
                set_depth, expect = None, False
        if token.kind == "word" and low == "set":
            set_depth, expect = depth, True
        elif set_depth is not None and depth == set_depth and token.kind == "word" and low in SET_LIST_ENDS:
            set_depth, expect = None, False
        elif set_depth is not None and depth == set_depth and token.text == ",":
            expect = True
        if token.text != "=":
            continue
        if expect and depth == set_depth:
            skip.add(i)
            expect = False
        elif raise_option(tokens, i, statement_words) or "diagnostics" in statement_words:
            skip.add(i)
    return skip


def raise_option(tokens: list[Token], i: int, statement_words: list[str]) -> bool:
    """Whether tokens[i] is the `=` of a RAISE ... USING option."""
    if "raise" not in statement_words or "using" not in statement_words or i < 2:
        return False
    return tokens[i - 1].low in RAISE_OPTIONS and (tokens[i - 2].low == "using" or tokens[i - 2].text == ",")


def between_ands(tokens: list[Token]) -> set[int]:
    """Indexes of the AND tokens that belong to BETWEEN x AND y."""
    skip, pending, depth = set(), [], 0
    for i, token in enumerate(tokens):
        if token.text in "([":
            depth += 1
        elif token.text in ")]":
            depth -= 1
        elif token.low == "between":
            pending.append(depth)
        elif token.low == "and" and pending and pending[-1] == depth:
            pending.pop()
            skip.add(i)
    return skip


def handler_ors(tokens: list[Token]) -> set[int]:
    """Indexes of the OR tokens of PL/pgSQL handlers, `EXCEPTION WHEN a OR b THEN`:
    a list of conditions, not a boolean expression."""
    skip, in_section, in_condition = set(), False, False
    for i, token in enumerate(tokens):
        previous = tokens[i - 1] if i else None
        if token.low == "exception" and (previous is None or previous.low != "raise"):
            in_section = True
        elif token.low == "when" and in_section and previous is not None and (
                previous.low == "exception" or previous.text == ";"):
            in_condition = True
        elif token.low == "then":
            in_condition = False
        elif token.low == "or" and in_condition:
            skip.add(i)
    return skip


def cmp_sites(tokens: list[Token]) -> list[Site]:
    """Comparison flips, skipping assignments."""
    skip = assignment_equals(tokens)
    return [Site("cmp", t.start, t.end, CMP_FLIPS[t.text])
            for i, t in enumerate(tokens)
            if t.kind == "op" and t.text in CMP_FLIPS and i not in skip]


def and_or_sites(tokens: list[Token]) -> list[Site]:
    """AND <-> OR, keeping the spelling's case, skipping BETWEEN's AND."""
    skip = between_ands(tokens) | handler_ors(tokens)
    sites = []
    for i, t in enumerate(tokens):
        if t.kind == "word" and t.low in ("and", "or") and i not in skip:
            other = "or" if t.low == "and" else "and"
            sites.append(Site("and_or", t.start, t.end, other.upper() if t.text.isupper() else other))
    return sites


def lock_clause_end(tokens: list[Token], i: int) -> int | None:
    """Index after the locking clause whose FOR is tokens[i], or None."""
    words = [t.low for t in tokens[i + 1:i + 4]]
    for strength in (["update"], ["no", "key", "update"], ["share"], ["key", "share"]):
        if words[:len(strength)] == strength:
            j = i + 1 + len(strength)
            break
    else:
        return None
    if j < len(tokens) and tokens[j].low == "of":
        j += 2
        while j < len(tokens) and tokens[j].text in (",", "."):
            j += 2
    if j < len(tokens) and tokens[j].low == "nowait":
        j += 1
    elif j + 1 < len(tokens) and tokens[j].low == "skip" and tokens[j + 1].low == "locked":
        j += 2
    return j


def row_lock_sites(tokens: list[Token]) -> list[Site]:
    """Each row-locking clause removed."""
    sites = []
    for i, t in enumerate(tokens):
        if t.low == "for" and t.kind == "word":
            j = lock_clause_end(tokens, i)
            if j is not None:
                sites.append(Site("row_lock", t.start, tokens[j - 1].end, ""))
    return sites


def clock_sites(tokens: list[Token]) -> list[Site]:
    """clock_timestamp() -> now()."""
    return [Site("clock", t.start, tokens[i + 2].end, "now()")
            for i, t in enumerate(tokens[:-2])
            if t.low == "clock_timestamp" and tokens[i + 1].text == "(" and tokens[i + 2].text == ")"]


def is_null_sites(tokens: list[Token]) -> list[Site]:
    """IS NULL <-> IS NOT NULL."""
    sites = []
    for i, t in enumerate(tokens[:-1]):
        if t.low != "is":
            continue
        if tokens[i + 1].low == "null":
            sites.append(Site("is_null", t.start, tokens[i + 1].end, "IS NOT NULL"))
        elif tokens[i + 1].low == "not" and i + 2 < len(tokens) and tokens[i + 2].low == "null":
            sites.append(Site("is_null", t.start, tokens[i + 2].end, "IS NULL"))
    return sites


def greatest_least_sites(tokens: list[Token]) -> list[Site]:
    """GREATEST <-> LEAST."""
    sites = []
    for i, t in enumerate(tokens[:-1]):
        if t.low in ("greatest", "least") and tokens[i + 1].text == "(":
            other = "least" if t.low == "greatest" else "greatest"
            sites.append(Site("greatest_least", t.start, t.end, other.upper() if t.text.isupper() else other))
    return sites


def plus_one_sites(tokens: list[Token], text: str) -> list[Site]:
    """`+ 1` -> `+ 0` (the literal 1 exactly)."""
    return [Site("plus_one", t.start, tokens[i + 1].end, text[t.start:tokens[i + 1].start] + "0")
            for i, t in enumerate(tokens[:-1])
            if t.kind == "op" and t.text == "+" and tokens[i + 1].kind == "number" and tokens[i + 1].text == "1"]


def security_definer_sites(tokens: list[Token]) -> list[Site]:
    """SECURITY DEFINER removed from the header."""
    return [Site("security_definer", t.start, tokens[i + 1].end, "")
            for i, t in enumerate(tokens[:-1])
            if t.low == "security" and tokens[i + 1].low == "definer"]


def search_path_sites(tokens: list[Token]) -> list[Site]:
    """The header's SET search_path clause removed."""
    sites = []
    for i, t in enumerate(tokens[:-2]):
        if t.low != "set" or tokens[i + 1].low != "search_path":
            continue
        j = i + 4  # past SET search_path {= | TO} value, or FROM CURRENT
        while j + 1 < len(tokens) and tokens[j].text == "," and tokens[j + 1].low not in HEADER_CLAUSES:
            j += 2
        sites.append(Site("search_path", t.start, tokens[j - 1].end, ""))
    return sites


def function_sites(function: Function) -> list[Site]:
    """Every mutation site of one function, in text order."""
    body, header = body_tokens(function), header_tokens(function)
    sites = (cmp_sites(body) + and_or_sites(body) + row_lock_sites(body) + clock_sites(body)
             + is_null_sites(body) + greatest_least_sites(body) + plus_one_sites(body, function.text)
             + security_definer_sites(header) + search_path_sites(header))
    return sorted(sites, key=lambda s: (s.start, list(OPERATORS).index(s.operator)))


# --------------------------------------------------------------------------
# Mutants


@dataclasses.dataclass
class Mutant:
    """One mutated function statement, ready to apply."""

    id: int
    function: str
    operator: str
    where: str  # migration directory:line
    line: int
    before: str
    after: str
    sql: str


CREATE_RE = re.compile(r"\ACREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION", re.IGNORECASE)


def mutate(function: Function, site: Site) -> str:
    """The function statement with one site replaced, as CREATE OR REPLACE."""
    text = function.text[:site.start] + site.replacement + function.text[site.end:]
    return CREATE_RE.sub("CREATE OR REPLACE FUNCTION", text, count=1)


def one_line(text: str) -> str:
    """Whitespace runs collapsed, for one-line displays."""
    return " ".join(text.split())


def build_mutants(functions: list[Function]) -> list[Mutant]:
    """Every mutant of every function, numbered from 1 in file order."""
    mutants = []
    for function in sorted(functions, key=lambda f: (str(f.file), f.line)):
        for site in function_sites(function):
            line = function.file_line(site.start)
            mutants.append(Mutant(
                id=len(mutants) + 1, function=function.label, operator=site.operator,
                where=f"{function.file.parent.name}:{line}", line=line,
                before=one_line(function.text[site.start:site.end]),
                after=one_line(site.replacement), sql=mutate(function, site)))
    return mutants


def patch_text(mutant: Mutant) -> str:
    """The file LEASEHOLD_TEST_SQL_PATCH names for a mutant."""
    return (f"-- leasehold mutant {mutant.id}: {mutant.function}, {mutant.operator}, "
            f"{mutant.where}: {mutant.before!r} -> {mutant.after!r}\n{mutant.sql}\n")


def select_mutants(mutants: list[Mutant], args: argparse.Namespace) -> list[Mutant]:
    """The mutants the options ask for (filters, then the sample)."""
    chosen = mutants
    if args.operators:
        wanted = set(args.operators.split(","))
        unknown = wanted - set(OPERATORS)
        if unknown:
            sys.exit(f"unknown operators: {', '.join(sorted(unknown))} (known: {', '.join(OPERATORS)})")
        chosen = [m for m in chosen if m.operator in wanted]
    if args.functions:
        pattern = re.compile(args.functions)
        chosen = [m for m in chosen if pattern.search(m.function)]
    if args.only:
        ids = {int(i) for i in args.only.split(",") if i.strip()}
        chosen = [m for m in chosen if m.id in ids]
    if args.sample is not None and args.sample < len(chosen):
        chosen = sorted(random.Random(args.seed).sample(chosen, args.sample), key=lambda m: m.id)
    return chosen


def arrow(mutant: Mutant) -> str:
    """`before → after`, with an empty side shown as ∅."""
    return f"{mutant.before or '∅'} → {mutant.after or '∅'}"


def print_list(mutants: list[Mutant], superseded: list[Function], unreachable: list[Function]) -> None:
    """The --list output: one line per mutant, then counts by operator."""
    for m in mutants:
        print(f"{m.id:5}  {m.function:32}  {m.operator:16}  {m.where:40}  {arrow(m)}")
    print(f"\n{len(mutants)} mutants")
    for operator in OPERATORS:
        print(f"  {operator:16} {sum(m.operator == operator for m in mutants):5}")
    for function in superseded:
        print(f"not mutated (redefined later): {function.name} at {function.file.parent.name}:{function.line}")
    for function in unreachable:
        print(f"body not mutated (called only while the migrations install, before a patch): {function.name} "
              f"at {function.file.parent.name}:{function.line}; --include-install-only runs them")


# --------------------------------------------------------------------------
# The scratch server (pre-check for stillborn mutants)


class ScratchServer:
    """A throwaway PostgreSQL cluster with the migrations applied, where each
    mutant is created inside a rolled-back transaction: a syntax or
    resolution error there means the mutant is stillborn."""

    def __init__(self, bin_dir: Path, files: list[Path]):
        self.bin_dir, self.files = bin_dir, files
        self.root = Path(tempfile.mkdtemp(prefix="leasehold-mutation-"))
        self.data = self.root / "data"
        self.started = False

    def as_server_user(self, argv: list[str]) -> list[str]:
        """argv run as `postgres` when this runs as root (initdb refuses root)."""
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs a server binary; output captured."""
        return subprocess.run(argv, capture_output=True, text=True, **kwargs)

    def start(self) -> None:
        """initdb, start (socket only, fsync off), install the migrations."""
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        pg = lambda name: str(self.bin_dir / name)  # noqa: E731
        self.check(self.run(self.as_server_user([pg("initdb"), "-D", str(self.data), "-U", "postgres",
                                                 "-A", "trust", "-E", "UTF8", "--no-sync"])), "initdb")
        options = f"-k {self.root} -c listen_addresses='' -c fsync=off -p 5432"
        self.check(self.run(self.as_server_user([pg("pg_ctl"), "-D", str(self.data), "-o", options,
                                                 "-l", str(self.root / "log"), "-w", "start"])), "pg_ctl start")
        self.started = True
        self.check(self.psql("postgres", "CREATE DATABASE scratch;", single=False), "CREATE DATABASE")
        self.check(self.psql("scratch", "CREATE SCHEMA IF NOT EXISTS lease;"), "CREATE SCHEMA")
        for path in self.files:
            self.check(self.psql("scratch", path.read_text()), f"install {path.parent.name}")

    def psql(self, database: str, sql: str, single: bool = True) -> subprocess.CompletedProcess:
        """Runs sql (in one transaction when `single`), stopping at the first error."""
        argv = [str(self.bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", *(["-1"] if single else []),
                "-h", str(self.root), "-p", "5432", "-U", "postgres", "-d", database]
        return self.run(argv, input=sql)

    def check(self, result: subprocess.CompletedProcess, what: str) -> None:
        """Raises with the output when a step failed."""
        if result.returncode != 0:
            raise RuntimeError(f"scratch server: {what} failed: {result.stderr.strip()[-2000:]}")

    def stillborn(self, mutant: Mutant) -> str | None:
        """The error creating the mutant gives, or None when it is created."""
        result = self.psql("scratch", f"{mutant.sql}\nROLLBACK;\n")
        if result.returncode == 0:
            return None
        if "ERROR:" not in result.stderr:  # not the statement: the server or psql
            raise RuntimeError(f"scratch server: {result.stderr.strip() or result.returncode}")
        return result.stderr.strip()

    def stop(self) -> None:
        """Stops the cluster and removes its directory."""
        if self.started:
            self.run(self.as_server_user([str(self.bin_dir / "pg_ctl"), "-D", str(self.data),
                                          "-m", "immediate", "stop"]))
        shutil.rmtree(self.root, ignore_errors=True)


def find_pg_bin(explicit: str | None) -> Path | None:
    """--pg-bin, LEASEHOLD_PG_BIN, or the newest /usr/lib/postgresql/*/bin."""
    for candidate in (explicit, os.environ.get("LEASEHOLD_PG_BIN")):
        if candidate:
            return Path(candidate)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                   if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


# --------------------------------------------------------------------------
# Building and running the suite


def build_test_binary(repo: Path) -> Path:
    """Builds the `leasehold` test target once; returns its executable."""
    argv = ["cargo", "test", "--test", TEST_TARGET, "--all-features", "--no-run", "--message-format=json"]
    log(f"building: {' '.join(argv)}")
    result = subprocess.run(argv, cwd=repo, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit("cargo build of the test binary failed")
    for line in result.stdout.splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        target = message.get("target", {})
        if (message.get("reason") == "compiler-artifact" and target.get("name") == TEST_TARGET
                and "test" in target.get("kind", []) and message.get("executable")):
            return Path(message["executable"])
    sys.exit("cargo did not report the test binary")


@dataclasses.dataclass
class SuiteRun:
    """What one run of the test binary gave."""

    results: dict[str, str]  # test name -> ok / FAILED / ignored
    returncode: int | None  # None: timed out
    seconds: float
    output: str


TEST_LINE_RE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)\b", re.MULTILINE)


def run_suite(binary: Path, repo: Path, patch: Path | None, libtest_args: list[str],
              timeout: float, log_path: Path, stop_on: set[str] | None = None,
              coverage_dir: Path | None = None) -> SuiteRun:
    """Runs the test binary (with the patch, if any) and parses its results.

    With `stop_on`, the run ends at the first test of that set reported
    FAILED: one such failure already decides that a mutant is killed, and
    the rest of the suite (minutes) would only name more killers."""
    env = dict(os.environ, CARGO_MANIFEST_DIR=str(repo))
    env.pop(PATCH_ENV, None)
    env.pop(COVERAGE_ENV, None)
    if coverage_dir is not None:
        env[COVERAGE_ENV] = str(coverage_dir)
    if patch is not None:
        env[PATCH_ENV] = str(patch)
    started = time.monotonic()
    with open(log_path, "w+") as out:
        process = subprocess.Popen([str(binary), *libtest_args], cwd=repo, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = wait_or_first_kill(process, log_path, timeout, stop_on, started)
        except BaseException:
            kill_group(process)  # Ctrl-C: its own session does not get the SIGINT
            raise
        out.seek(0)
        output = out.read()
    results = {m.group(1): m.group(2) for m in TEST_LINE_RE.finditer(output)}
    return SuiteRun(results, returncode, time.monotonic() - started, output)


def wait_or_first_kill(process: subprocess.Popen, log_path: Path, timeout: float,
                       stop_on: set[str] | None, started: float) -> int | None:
    """The binary's exit status; None when it timed out. With `stop_on`, it
    is killed at the first FAILED test of that set (status -9 then)."""
    if not stop_on:
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            return None
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        text = log_path.read_text(errors="replace")
        if any(m.group(2) == "FAILED" and m.group(1) in stop_on for m in TEST_LINE_RE.finditer(text)):
            kill_group(process)
            return process.returncode
        if time.monotonic() - started > timeout:
            kill_group(process)
            return None


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILLs the test binary's process group. Its PostgreSQL servers run in
    groups of their own; their watchdogs stop them once the binary is gone."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()



# --------------------------------------------------------------------------
# Which tests can notice a mutant


def read_coverage(directory: Path) -> dict[str, set[str] | None]:
    """Each test's recorded functions (test-support/src/coverage.rs): test
    name -> lower-case qualified names; None for a test that marked itself
    as calling everything (`*`: it installed on a server of its own)."""
    coverage: dict[str, set[str] | None] = {}
    if not directory.is_dir():
        return coverage
    for path in directory.iterdir():
        names: set[str] | None = set()
        for line in path.read_text(errors="replace").splitlines():
            line = line.strip().lower()
            if not line or line.startswith("#"):
                continue
            if line == "*":
                names = None
                break
            names.add(line)
        coverage[path.name] = names
    return coverage


def defining_statements(text: str) -> str:
    """The statements of a migration that define what runs later on its own:
    tables, domains, views, triggers, indexes, policies (CREATE other than
    FUNCTION, ALTER TABLE, ALTER DOMAIN). Grants, comments and install-time
    SELECTs name functions without running them later."""
    kept = []
    for start, end, tokens in statements(text):
        words = [t.low for t in tokens[:2]]
        defines = (words[:1] == ["create"] and not is_create_function(tokens)) or \
            words in (["alter", "table"], ["alter", "domain"])
        if defines:
            kept.append(" ".join(t.text for t in tokens))
    return "\n".join(kept).lower()


class Reach:
    """Which functions' calls can run a given function's code.

    A call of F runs F; so does a call of any function whose body calls F,
    directly or through others (small SQL helpers are inlined into their
    callers' plans and never counted as calls of their own, so the callers'
    counts stand for them). A function named outside function bodies (a
    domain or table CHECK, a default, a trigger) can run on any write: its
    mutants get every test."""

    def __init__(self, functions: list[Function], files: list[Path]):
        names = sorted({f.name.lower() for f in functions})
        self.callers: dict[str, set[str]] = {n: set() for n in names}
        for caller in functions:
            body = caller.body.text.lower()
            for name in names:
                if name != caller.name.lower() and self.mentions(body, name):
                    self.callers[name].add(caller.name.lower())
        ddl = "\n".join(defining_statements(path.read_text()) for path in files)
        self.in_ddl = {n for n in names if self.mentions(ddl, n)}
        self.inlinable = {f.name.lower() for f in functions if inlinable(f)}
        self.sources = source_texts(files[0].parents[2] if files else REPO)

    @staticmethod
    def mentions(text: str, name: str) -> bool:
        """Whether text names the function, qualified or not."""
        short = name.split(".")[-1]
        return re.search(r"(?<![\w.])(?:" + re.escape(name) + "|" + re.escape(short) + r")\b", text) is not None

    def closure(self, name: str) -> set[str] | None:
        """The function and every function that reaches it through calls;
        None when it is named in the DDL (anything may run it)."""
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            if current in self.in_ddl:
                return None
            seen.add(current)
            todo.extend(self.callers.get(current, ()))
        return seen


def inlinable(function: Function) -> bool:
    """Whether the planner may inline the function into the statement that
    calls it (a SQL function with no SET clause, not SECURITY DEFINER): then
    a call is never counted as one, wherever it is written."""
    header = " ".join(t.low for t in header_tokens(function))
    return re.search(r"\blanguage sql\b", header) is not None and " set " not in f" {header} " \
        and "security definer" not in header


def source_texts(repo: Path) -> dict[str, str]:
    """The Rust sources that may send SQL naming a function: the library, the
    CLI, test-support and the SQL-level suite (path relative to repo -> text)."""
    texts = {}
    for folder in ("src", "cli/src", "test-support/src", "tests/leasehold"):
        for path in sorted((repo / folder).rglob("*.rs")):
            texts[str(path.relative_to(repo))] = path.read_text(errors="replace")
    return texts


def direct_callers(name: str, sources: dict[str, str]) -> set[str] | None:
    """The test modules whose own source calls an inlinable function by
    name (so no count shows it), as `module::` prefixes; None when the
    library, the CLI, test-support or a module the tests share calls it
    (any test may then run it)."""
    prefixes: set[str] = set()
    pattern = re.compile(r"lease\." + re.escape(name.split(".")[-1]) + r"\b", re.IGNORECASE)
    for path, text in sources.items():
        if not pattern.search(text):
            continue
        parts = Path(path).parts
        if parts[:2] != ("tests", "leasehold") or len(parts) < 3:
            return None
        module = Path(parts[2]).stem
        if module == "main" or "common" in module:
            return None
        prefixes.add(module + "::")
    return prefixes


def function_name(mutant: Mutant) -> str:
    """The mutant's function without its /arity label."""
    return mutant.function.split("/")[0].lower()


def select_tests(mutant: Mutant, passed: set[str], coverage: dict[str, set[str] | None],
                 reach: Reach | None) -> set[str]:
    """The baseline-passing tests that can notice the mutant.

    Without coverage, every one. A header mutant (SECURITY DEFINER or the
    search_path pin dropped) is noticed by the catalog tests, which read
    pg_proc rather than call the function: every test. Otherwise the tests
    whose record names a function that reaches the changed one, and every
    test without a record (its calls were not counted: assume all)."""
    if reach is None or mutant.operator in HEADER_OPERATORS:
        return set(passed)
    closure = reach.closure(function_name(mutant))
    if closure is None:
        return set(passed)
    counted = set().union(*(c for c in coverage.values() if c is not None)) if coverage else set()
    if not closure & counted:
        return set(passed)  # no test's count shows it: do not trust the counts for it
    prefixes: set[str] = set()
    for name in closure & reach.inlinable:
        callers = direct_callers(name, reach.sources)
        if callers is None:
            return set(passed)
        prefixes |= callers
    return {t for t in passed
            if coverage.get(t, None) is None or coverage[t] & closure
            or any(t.startswith(p) for p in prefixes)}


def killer_key(mutant: Mutant) -> str:
    """What killers are tallied under: the function, or for a header mutant
    the operator (the catalog tests kill those, whatever the function)."""
    return mutant.operator if mutant.operator in HEADER_OPERATORS else function_name(mutant)


def first_tests(mutant: Mutant, chosen: set[str], killers: dict[str, dict[str, int]],
                reach: Reach | None = None) -> set[str]:
    """The tests to try first: the 6 that killed most earlier mutants of the
    same function (or, for a header mutant, of the same operator), the 6
    that killed most mutants of any function, and the tests of the modules
    whose source names the function, when they are few (at most 40): a test
    written about a function is the likeliest to notice a change to it."""
    def top(counts: dict[str, int]) -> list[str]:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return [t for t, _ in ranked if t in chosen][:6]
    overall: dict[str, int] = {}
    for counts in killers.values():
        for test, n in counts.items():
            overall[test] = overall.get(test, 0) + n
    first = set(top(killers.get(killer_key(mutant), {}))) | set(top(overall))
    if reach is not None and mutant.operator not in HEADER_OPERATORS:
        prefixes = direct_callers(function_name(mutant), reach.sources)
        if prefixes:
            named = {t for t in chosen if any(t.startswith(p) for p in prefixes)}
            if len(named) <= 40:
                first |= named
    return first


def note_killers(mutant: Mutant, outcome: "Outcome", killers: dict[str, dict[str, int]]) -> None:
    """Remembers a mutant's killing tests for first_tests."""
    counts = killers.setdefault(killer_key(mutant), {})
    for test in outcome.killers:
        counts[test] = counts.get(test, 0) + 1


def exact_args(tests: set[str], libtest: list[str]) -> list[str]:
    """libtest arguments running exactly these tests."""
    return [*libtest, "--exact", *sorted(tests)]


@dataclasses.dataclass
class Outcome:
    """A mutant's result."""

    mutant: Mutant
    result: str  # killed, survived, stillborn, timeout, skipped
    killers: list[str]
    seconds: float
    note: str = ""


def judge(mutant: Mutant, run: SuiteRun, baseline: set[str]) -> Outcome:
    """Killed when a test that passed on the baseline (and ran: `baseline`
    is the tests run) does not pass now."""
    if run.returncode is None:
        return Outcome(mutant, "timeout", [], run.seconds, "suite timed out: counted as killed")
    if PATCH_FAILURE_MARK in run.output:
        return Outcome(mutant, "stillborn", [], run.seconds, "the patch failed in test-support")
    failed = sorted(t for t in baseline if run.results.get(t) == "FAILED")
    missing = sorted(t for t in baseline if t not in run.results)
    if failed:
        return Outcome(mutant, "killed", failed, run.seconds)
    if missing and run.returncode != 0:
        return Outcome(mutant, "killed", [], run.seconds,
                       f"test binary exited with {run.returncode} before {len(missing)} tests reported")
    return Outcome(mutant, "survived", [], run.seconds)


# --------------------------------------------------------------------------
# The report


def md(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`" if text else "∅"


def render_report(outcomes: list[Outcome], baseline: SuiteRun, planned: int, binary: Path) -> str:
    """The markdown report: a table of mutants, then totals and the kill rate."""
    lines = ["# leasehold SQL mutation report", "",
             f"Test binary: `{binary.name}`; baseline: {sum(v == 'ok' for v in baseline.results.values())} "
             f"tests passed in {baseline.seconds:.0f} s. Mutants run: {len(outcomes)} of {planned} selected.", "",
             "| id | function | operator | line | before → after | result | killing tests |",
             "|---:|---|---|---|---|---|---|"]
    for o in outcomes:
        m = o.mutant
        killers = ", ".join(o.killers[:3]) + (f" (+{len(o.killers) - 3})" if len(o.killers) > 3 else "")
        detail = "; ".join(x for x in (killers, o.note) if x)
        lines.append(f"| {m.id} | {m.function} | {m.operator} | {m.where} | {md(m.before)} → {md(m.after)} "
                     f"| {o.result} | {detail.replace('|', '/')} |")
    lines += ["", *summary_lines(outcomes)]
    return "\n".join(lines) + "\n"


def summary_lines(outcomes: list[Outcome]) -> list[str]:
    """Totals per result and the kill rate (timeouts count as killed)."""
    count = lambda r: sum(o.result == r for o in outcomes)  # noqa: E731
    killed, timeout, survived = count("killed"), count("timeout"), count("survived")
    decided = killed + timeout + survived
    rate = f"{100 * (killed + timeout) / decided:.1f}%" if decided else "n/a"
    return [f"- killed: {killed}", f"- timeout (counted as killed): {timeout}", f"- survived: {survived}",
            f"- stillborn (patch does not apply; not counted): {count('stillborn')}",
            f"- kill rate, (killed + timeout) / (killed + timeout + survived): {rate}",
            f"- suite time: {sum(o.seconds for o in outcomes):.0f} s"]


# --------------------------------------------------------------------------
# Command line


def log(message: str) -> None:
    """Progress to stderr."""
    print(f"[mutate {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options, and the libtest arguments after `--`."""
    libtest = []
    if "--" in argv:
        at = argv.index("--")
        argv, libtest = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the selected mutants and exit")
    parser.add_argument("--show", type=int, metavar="ID", help="print one mutant's patch SQL and exit")
    parser.add_argument("--only", metavar="ID[,ID]", help="only these mutant ids")
    parser.add_argument("--sample", type=int, metavar="N", help="a random sample of N mutants")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    parser.add_argument("--operators", metavar="a,b", help=f"only these operators: {', '.join(OPERATORS)}")
    parser.add_argument("--functions", metavar="REGEX", help="only functions whose name matches (re.search)")
    parser.add_argument("--outcomes", type=Path, help="where outcomes are recorded, one JSON line per "
                        "mutant, and --resume reads them (default: <workdir>/outcomes.jsonl)")
    parser.add_argument("--report", type=Path, help="markdown report (default: <workdir>/report.md)")
    parser.add_argument("--workdir", type=Path, help="patches and logs "
                        "(default: $CARGO_TARGET_DIR/mutation, else target/mutation)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per suite run (default 900)")
    parser.add_argument("--full-runs", action="store_true",
                        help="run the whole suite for every mutant (default: stop at its first killing test)")
    parser.add_argument("--no-coverage", action="store_true",
                        help="run every test against every mutant (default: only the tests whose counted "
                        "function calls reach the mutated function; see README)")
    parser.add_argument("--include-install-only", action="store_true",
                        help="also run the mutants of functions only the migrations call (never killed: see README)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the outcomes recorded in <workdir>/outcomes.jsonl and run only the rest")
    parser.add_argument("--binary", type=Path, help="use this test binary instead of building")
    parser.add_argument("--first", action="append", default=[], metavar="TEST",
                        help="also try this test in every mutant's first round (repeatable): a test "
                        "added since the recorded outcomes has no kills to rank it by")
    parser.add_argument("--pg-bin", help="server binaries for the pre-check (default: LEASEHOLD_PG_BIN, "
                        "else the newest /usr/lib/postgresql/*/bin)")
    parser.add_argument("--no-precheck", action="store_true", help="skip the scratch-server pre-check")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    return parser.parse_args(argv), libtest


def default_workdir(repo: Path) -> Path:
    """$CARGO_TARGET_DIR/mutation, else <repo>/target/mutation."""
    target = os.environ.get("CARGO_TARGET_DIR")
    return (Path(target) if target else repo / "target") / "mutation"


def start_precheck(args: argparse.Namespace, files: list[Path]) -> ScratchServer | None:
    """The scratch server, or None (with a warning) when it cannot start."""
    if args.no_precheck:
        return None
    bin_dir = find_pg_bin(args.pg_bin)
    if bin_dir is None:
        log("no PostgreSQL binaries found: no pre-check (the suite run still detects stillborn mutants)")
        return None
    server = ScratchServer(bin_dir, files)
    try:
        server.start()
    except (RuntimeError, OSError) as error:
        server.stop()
        log(f"{error}\nno pre-check (the suite run still detects stillborn mutants)")
        return None
    log(f"pre-check server up ({bin_dir}), migrations installed")
    return server


def file_digest(path: Path) -> str:
    """sha256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run_baseline(binary: Path, args: argparse.Namespace, libtest: list[str], workdir: Path) -> SuiteRun:
    """The suite without a patch; exits when it does not complete. With
    --resume, an earlier baseline of the same test binary and arguments (and
    its call counts) is reused: minutes saved at every restart."""
    saved = workdir / "baseline.json"
    key = {"binary": file_digest(binary), "libtest": libtest, "coverage": not args.no_coverage}
    if args.resume and saved.exists():
        entry = json.loads(saved.read_text())
        if entry.get("key") == key and (args.no_coverage or (workdir / "coverage").is_dir()):
            log(f"baseline reused from {saved} (same test binary and arguments)")
            return SuiteRun(entry["results"], 0, entry["seconds"], "")
    coverage_dir = None
    if not args.no_coverage:
        coverage_dir = workdir / "coverage"
        shutil.rmtree(coverage_dir, ignore_errors=True)
    log("baseline run (no patch)" + ("" if coverage_dir is None else ", counting each test's function calls"))
    baseline = run_suite(binary, args.repo, None, libtest, 2 * args.timeout, workdir / "baseline.log",
                         coverage_dir=coverage_dir)
    passed = [t for t, r in baseline.results.items() if r == "ok"]
    failed = [t for t, r in baseline.results.items() if r == "FAILED"]
    if baseline.returncode is None or not passed:
        sys.exit(f"baseline run did not complete; see {workdir / 'baseline.log'}")
    log(f"baseline: {len(passed)} passed, {len(failed)} failed (ignored for judging), "
        f"{baseline.seconds:.0f} s")
    for name in failed:
        log(f"  baseline failure: {name}")
    saved.write_text(json.dumps({"key": key, "results": baseline.results, "seconds": baseline.seconds}))
    return baseline


def run_mutant(mutant: Mutant, ctx: dict) -> Outcome:
    """Pre-checks one mutant, then runs the tests that can notice it: first
    the likeliest killers, then the rest (see select_tests, first_tests)."""
    if ctx["server"] is not None:
        error = ctx["server"].stillborn(mutant)
        if error is not None:
            return Outcome(mutant, "stillborn", [], 0.0, one_line(error.splitlines()[0])[:160])
    patch = ctx["workdir"] / f"mutant-{mutant.id}.sql"
    patch.write_text(patch_text(mutant))
    args, passed = ctx["args"], ctx["passed"]
    chosen = select_tests(mutant, passed, ctx["coverage"], ctx["reach"])
    log_path = ctx["workdir"] / f"mutant-{mutant.id}.log"
    if args.full_runs:
        run = run_suite(ctx["binary"], args.repo, patch, ctx["libtest"], args.timeout, log_path)
        outcome = judge(mutant, run, passed)
    elif not chosen:
        outcome = Outcome(mutant, "survived", [], 0.0)
    else:
        first = first_tests(mutant, chosen, ctx["killers"], ctx["reach"]) | (chosen & set(args.first))
        seconds, outcome = 0.0, None
        for tests in (first, chosen - first):
            if not tests:
                continue
            run = run_suite(ctx["binary"], args.repo, patch, exact_args(tests, ctx["libtest"]),
                            args.timeout, log_path, stop_on=tests)
            seconds += run.seconds
            outcome = judge(mutant, run, tests)
            if outcome.result != "survived":
                break
        assert outcome is not None
        outcome.seconds = seconds
    if len(chosen) < len(passed) and not args.full_runs:
        outcome.note = "; ".join(x for x in (outcome.note, f"{len(chosen)} of {len(passed)} tests reach it") if x)
    note_killers(mutant, outcome, ctx["killers"])
    return outcome


def sql_digest(sql: str) -> str:
    """sha256 of a mutant's SQL: what ties a recorded outcome to its mutant."""
    return hashlib.sha256(sql.encode()).hexdigest()


def load_outcomes(recorded: Path, chosen: list[Mutant]) -> list[Outcome]:
    """The outcomes an earlier run recorded for mutants still chosen, so a run
    of many hours can be split over several. A record is matched by the
    sha256 of its mutant's SQL, not by its id: editing one function of the
    migrations renumbers the mutants after it, but only the edited
    function's mutants lose their records and are judged again."""
    if not recorded.exists():
        return []
    by_sql = {sql_digest(m.sql): m for m in chosen}
    outcomes = []
    for line in recorded.read_text().splitlines():
        entry = json.loads(line)
        mutant = by_sql.get(entry.get("sql_sha256", sql_digest(entry.get("sql", ""))))
        if mutant is not None:
            outcomes.append(Outcome(mutant, entry["result"], entry["killers"], entry["seconds"], entry["note"]))
    return outcomes


def run_all(chosen: list[Mutant], args: argparse.Namespace, libtest: list[str], files: list[Path],
            functions: list[Function], all_mutants: list[Mutant]) -> int:
    """Builds, runs the baseline and every chosen mutant, writes the report."""
    workdir = (args.workdir or default_workdir(args.repo)).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    report = (args.report or workdir / "report.md").resolve()
    binary = args.binary or build_test_binary(args.repo)
    server = start_precheck(args, files)
    try:
        baseline = run_baseline(binary, args, libtest, workdir)
        passed = {t for t, r in baseline.results.items() if r == "ok"}
        coverage = {} if args.no_coverage else read_coverage(workdir / "coverage")
        if not args.no_coverage:
            recorded_tests = sum(t in coverage for t in passed)
            log(f"call counts recorded for {recorded_tests} of {len(passed)} passing tests "
                "(the others run against every mutant)")
        ctx = {"server": server, "workdir": workdir, "binary": binary, "args": args, "libtest": libtest,
               "passed": passed, "coverage": coverage, "killers": {},
               "all_mutants": all_mutants,
               "reach": None if args.no_coverage else Reach(functions, files)}
        recorded = (args.outcomes or workdir / "outcomes.jsonl").resolve()
        if args.resume:
            # Every recorded outcome teaches the first round (first_tests);
            # only the chosen mutants' are reported and skipped. The file
            # keeps the others' lines: --only with --resume adds to it.
            for outcome in load_outcomes(recorded, ctx["all_mutants"]):
                note_killers(outcome.mutant, outcome, ctx["killers"])
            outcomes = load_outcomes(recorded, chosen)
            log(f"resuming: {len(outcomes)} of the chosen mutants already decided in {recorded}")
        else:
            outcomes = []
            if recorded.exists():
                recorded.unlink()
        done = {o.mutant.id for o in outcomes}
        for n, mutant in enumerate(chosen, 1):
            if mutant.id in done:
                continue
            log(f"[{n}/{len(chosen)}] mutant {mutant.id}: {mutant.function} {mutant.operator} "
                f"{mutant.where} {arrow(mutant)}")
            outcome = run_mutant(mutant, ctx)
            outcomes.append(outcome)
            with open(recorded, "a") as out:
                out.write(json.dumps({"id": mutant.id, "sql_sha256": sql_digest(mutant.sql), "result": outcome.result,
                                      "killers": outcome.killers, "seconds": outcome.seconds,
                                      "note": outcome.note}) + "\n")
            log(f"  -> {outcome.result} ({outcome.seconds:.0f} s) {', '.join(outcome.killers[:3])} {outcome.note}")
            report.write_text(render_report(outcomes, baseline, len(chosen), binary))
    finally:
        if server is not None:
            server.stop()
    print("\n".join(summary_lines(outcomes)))
    print(f"report: {report}")
    return 0


def main(argv: list[str]) -> int:
    """Entry point."""
    args, libtest = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    files = migration_files(args.repo)
    if not files:
        sys.exit(f"no migrations/*/up.sql or sql/functions/*.sql under {args.repo}")
    functions, superseded = parse_functions(files)
    all_mutants = build_mutants(functions)
    mutants = all_mutants
    if args.show is not None:
        print(next((patch_text(m) for m in mutants if m.id == args.show), f"no mutant {args.show}"))
        return 0
    unreachable = install_only(files, functions)
    if not args.include_install_only:
        # Their headers stay in: the catalog tests read every function's
        # SECURITY DEFINER and search_path, install-only ones included.
        names = {f.label for f in unreachable}
        mutants = [m for m in mutants
                   if m.function not in names or m.operator in HEADER_OPERATORS]
    chosen = select_mutants(mutants, args)
    if args.list:
        print_list(chosen, superseded, [] if args.include_install_only else unreachable)
        return 0
    if not chosen:
        sys.exit("no mutants selected")
    return run_all(chosen, args, libtest, files, functions, all_mutants)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
