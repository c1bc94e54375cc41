"""The documentation stays current with the code (issue #23): every relative link in the
README and ``docs/`` resolves (file and heading), ``docs/cli.md`` names every command and
flag of the CLI's parser, and ``docs/configuration.md`` documents every key of the schema,
every method's and server optimizer's parameters and the signal exchange's. All walked from
the code, nothing listed here; in-process, well under a second."""

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


def test_configuration_md_documents_every_parameter():
    from fedrcl_flwr.server.signal_exchange import SignalExchange

    page = DOCS / "configuration.md"
    missing = []
    for registry, heading in (
        (CLIENTS, "Method parameters"),
        (STRATEGIES, "Server optimizer parameters"),
    ):
        text = _section(page, heading)
        for name in sorted(registry.builtin):
            rows = re.search(rf"^\| `{re.escape(name)}` \|.*?(?=^\| `|\Z)", text, re.S | re.M)
            if rows is None:
                missing.append(f"{registry.key} {name}: no table row")
                continue
            missing += [
                f"{registry.key} {name}: parameter {key}"
                for key in registry.declared(name).defaults
                if f"| `{key}` |" not in rows.group(0)
            ]
    text = _section(page, "Signal exchange")
    missing += [
        f"server.signals {key}" for key in SignalExchange.defaults if f"| `{key}` |" not in text
    ]
    assert not missing, missing
