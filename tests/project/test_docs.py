"""The documentation stays current with the code: every relative link in the README and
``docs/`` resolves (file and heading), ``docs/cli.md`` names every command and flag of the
CLI's parser, and ``docs/configuration.md`` documents every key of the schema, every
method's and server optimizer's parameters and the signal exchange's. All walked from the
code, nothing listed here. The pages are references, not a log: the README and
``docs/performance.md`` stay within 12 KB, and no page, comment or docstring speaks of work sessions or
issue numbers (history lives in git). In-process, well under a second."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import yaml

from clients import CLIENTS
from fedrcl_flwr.cli import build_parser
from fedrcl_flwr.config import ExperimentConfig
from strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(path: Path) -> str:
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces -> '-'."""
    out = set()
    for line in _prose(path).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def _relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def _section(path: Path, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


SHORT_PAGES = {"README.md": ROOT / "README.md", "performance.md": DOCS / "performance.md"}
MAX_BYTES = 12_000
HISTORY = re.compile(r"\bsessions?\b|\bissues?\s*#?\d+|(?<![\w&/])#\d+\b", re.I)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")


def _running_text(text: str) -> str:
    """The words a reader reads: code blocks blanked (line numbers kept), inline code and
    link targets (a URL may name an upstream bug) left out."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return LINK_TARGET.sub("]()", CODE_SPAN.sub("``", text))


def _history_words(text: str) -> list[str]:
    return [
        f"line {n}: {m.group(0)!r}"
        for n, line in enumerate(_running_text(text).splitlines(), 1)
        for m in HISTORY.finditer(line)
    ]


@pytest.mark.parametrize("name", SHORT_PAGES)
def test_the_entry_pages_are_read_in_one_sitting(name):
    size = len(SHORT_PAGES[name].read_bytes())
    assert size <= MAX_BYTES, f"{name}: {size} bytes, at most {MAX_BYTES}: move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_speaks_of_sessions_or_issue_numbers(page):
    hits = _history_words(page.read_text(encoding="utf-8"))
    assert not hits, f"{page.name}: history belongs in git, not in the docs: {hits}"


def test_the_history_check_catches_each_form():
    for text in ("in the fourth session", "Sessions ran", "issue 41", "see Issue #7", "(#42)"):
        assert _history_words(text), text
    clean = (
        "`start_new_session=True`, [a bug](https://github.com/o/r/issues/7953), "
        "[a heading](cli.md#exit-codes), a 5 % issue of the model, &#8212;\n"
        "```\nsession 3, issue 4\n```\nlast line"
    )
    assert _history_words(clean) == []
    assert _history_words("```\nx\n```\nissue 9") == ["line 4: 'issue 9'"]


# in code, comments and docstrings: "issue 31", "Issue #25", "issues 13 and 20"; an
# upstream bug named with its project ("Flower issue #7953", "flwr issue #7953") is a fact
CODE_HISTORY = re.compile(r"(?<!flwr )(?<!flower )(?<!ray )\bissues?\s*#?\d+", re.I)
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".cfg", ".sh")


def _code_history_words(text: str) -> list[str]:
    return [
        f"line {n}: {m.group(0)!r}"
        for n, line in enumerate(text.splitlines(), 1)
        for m in CODE_HISTORY.finditer(line)
    ]


def _project_code_files() -> list[Path]:
    skip = {".git", ".venv", "build", "runs", "node_modules"}
    return [
        p
        for p in sorted(ROOT.rglob("*"))
        if p.suffix in CODE_SUFFIXES
        and p.is_file()
        and not skip.intersection(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
        and p != Path(__file__).resolve()
    ]


def test_no_code_comment_or_docstring_speaks_of_issue_numbers():
    hits = {
        str(p.relative_to(ROOT)): words
        for p in _project_code_files()
        if (words := _code_history_words(p.read_text(encoding="utf-8", errors="replace")))
    }
    assert not hits, f"history belongs in git, not in the code: {hits}"


def test_the_code_history_check_catches_each_form():
    for text in ("(issue 31)", "Issue #25: labels", "issues 13 and 20", "# see issue30"):
        assert _code_history_words(text), text
    for text in ("Flower issue #7953", "(flwr issue #7953)", "a 5 % issue of the model"):
        assert _code_history_words(text) == [], text


def test_the_reference_pages_exist():
    for name in (
        "index",
        "configuration",
        "cli",
        "datasets",
        "reproducing",
        "deployment",
        "performance",
        "research",
    ):
        assert (DOCS / f"{name}.md").is_file(), name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in _relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: {broken}"


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def test_cli_md_names_every_command_flag_and_choice():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = []
    for name, parser in _commands().items():
        if name and f"## {name}" not in text:
            missing.append(f"section '## {name}'")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for opt in action.option_strings:
                if opt.startswith("--") and f"`{opt}" not in text:
                    missing.append(f"{name} {opt}")
            for choice in action.choices or ():
                if str(choice) not in text:
                    missing.append(f"{name} {action.dest}={choice}")
    assert not missing, missing


def _schema(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = _schema(type(default)) if dataclasses.is_dataclass(default) else default
    return out


def _documented_yaml() -> dict:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("name:")]
    assert len(blocks) == 1, "configuration.md: one YAML block of every key, from name:"
    return yaml.safe_load(blocks[0])


def _key_differences(doc: dict, schema: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(doc) | set(schema)):
        dotted = prefix + key
        if key not in schema:
            out.append(f"{dotted}: documented, not in the schema")
        elif key not in doc:
            out.append(f"{dotted}: in the schema, not documented")
        elif isinstance(schema[key], dict) and schema[key] and isinstance(doc[key], dict):
            out += _key_differences(doc[key], schema[key], dotted + ".")
        elif isinstance(schema[key], dict) and schema[key]:
            out.append(f"{dotted}: a section, documented as {doc[key]!r}")
        elif not _same_default(doc[key], schema[key]):
            out.append(f"{dotted}: documented default {doc[key]!r}, schema {schema[key]!r}")
    return out


def _same_default(doc, schema) -> bool:
    if isinstance(schema, float) and isinstance(doc, (int, float)):
        return abs(doc - schema) <= 1e-6 * max(1.0, abs(schema))
    if schema == "off":  # YAML reads a bare off as false (client.amp)
        return doc in ("off", False)
    return doc == schema


def test_configuration_md_documents_every_key_with_its_default():
    diffs = _key_differences(_documented_yaml(), _schema(ExperimentConfig))
    assert not diffs, diffs


def test_configuration_md_documents_optional_sections_keys():
    """The keys of a section that is null by default (``privacy.dp``), named in its comment."""
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = []
    for f in dataclasses.fields(ExperimentConfig):
        section = f.default_factory() if callable(f.default_factory) else None
        if not dataclasses.is_dataclass(section):
            continue
        for name, hint in typing.get_type_hints(type(section)).items():
            for cls in typing.get_args(hint):
                if dataclasses.is_dataclass(cls):
                    missing += [
                        f"{f.name}.{name}.{k.name}"
                        for k in dataclasses.fields(cls)
                        if not re.search(rf"\b{k.name}\b", text)
                    ]
    assert not missing, missing


def _cell_value(cell: str):
    """A default as the table writes it: YAML (``[all]``, ``true``, ``0.001``) or a
    fraction (``8/255``)."""
    text = cell.strip().strip("`")
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    return int(m.group(1)) / int(m.group(2)) if m else yaml.safe_load(text)


def _allowed_text(default, rule) -> str:
    if rule is not None:
        return rule.text
    return "true or false" if isinstance(default, bool) else "any " + type(default).__name__


def _documented_rows(text: str, name: str) -> list[tuple[str, str, str]] | None:
    """``(parameter, default, allowed)`` of component ``name``'s rows in a parameter table
    (its first row names it, the rows below it leave the name empty)."""
    rows = re.search(rf"^\| `{re.escape(name)}` \|.*?(?=^\| `|^[^|]|\Z)", text, re.S | re.M)
    if rows is None:
        return None
    out = []
    for line in rows.group(0).strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[2] != "—":
            out.append((cells[2].strip("`"), cells[3], cells[4]))
    return out


def _parameter_problems(label: str, documented, defaults: dict, rules: dict) -> list[str]:
    """What a table's rows get wrong about the declared ``defaults`` / ``rules``: the
    parameters and their order, each default's value and each rule's text."""
    if documented is None:
        return [f"{label}: no table row"]
    names = [r[0] for r in documented]
    if names != list(defaults):
        return [f"{label}: the table lists {names}, the class declares {list(defaults)}"]
    problems = []
    for key, default_cell, allowed in documented:
        want = defaults[key]
        if _cell_value(default_cell) != want or type(_cell_value(default_cell)) is not type(want):
            problems.append(f"{label} {key}: default {default_cell}, declared {want!r}")
        if allowed != _allowed_text(want, rules.get(key)):
            problems.append(
                f"{label} {key}: allowed '{allowed}', declared '{_allowed_text(want, rules.get(key))}'"
            )
    return problems


def test_configuration_md_parameter_tables_match_the_declarations():
    """Every method's and server optimizer's row in ``docs/configuration.md`` names its
    file and lists exactly the parameters its class declares, in order, with the declared
    default and the rule's own words (and the signal exchange's table likewise)."""
    from fedrcl_flwr.server.signal_exchange import SignalExchange

    page = DOCS / "configuration.md"
    problems = []
    for registry, heading in (
        (CLIENTS, "Method parameters"),
        (STRATEGIES, "Server optimizer parameters"),
    ):
        text = _section(page, heading)
        for name in sorted(registry.builtin):
            module = registry.target(name).split(":")[0].replace(".", "/") + ".py"
            if f"| `{name}` | [{module}](../{module}) |" not in text:
                problems.append(f"{registry.key} {name}: its row must link [{module}]")
            defaults, rules = registry.params(name)
            documented = _documented_rows(text, name)
            problems += _parameter_problems(f"{registry.key} {name}", documented, defaults, rules)
    text = _section(page, "Signal exchange")
    documented = [
        (c[0].strip("`"), c[1], c[2])
        for c in (
            [x.strip() for x in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if line.startswith("| `")
        )
    ]
    problems += _parameter_problems(
        "server.signals", documented, SignalExchange.defaults, SignalExchange.rules
    )
    assert not problems, "\n".join(problems)


def test_the_parameter_table_check_catches_a_wrong_row():
    """The check above fails on each kind of drift: a wrong default, a rule's words, a
    missing and a reordered parameter."""
    from fedrcl_flwr.components import non_negative, positive

    defaults, rules = {"mu": 0.001, "halve": True}, {"mu": non_negative()}
    good = [("mu", "`0.001`", "must be >= 0"), ("halve", "`true`", "true or false")]
    assert _parameter_problems("m", good, defaults, rules) == []
    assert _parameter_problems("m", [good[0], ("halve", "`1`", "true or false")], defaults, rules)
    assert _parameter_problems("m", [("mu", "`0.01`", "must be >= 0"), good[1]], defaults, rules)
    assert _parameter_problems("m", good, defaults, {"mu": positive()})
    assert _parameter_problems("m", good[:1], defaults, rules)
    assert _parameter_problems("m", good[::-1], defaults, rules)
    assert _parameter_problems("m", None, defaults, rules) == ["m: no table row"]
