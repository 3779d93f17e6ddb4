"""One registry of fault kinds (node/sim/faults.py KINDS): both simulators' parsers accept exactly its kinds,
`--faults help` lists them, and docs/simulator.md shows its table."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradnode.node.cli import app
from gradnode.node.sim import faults, scenario

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = {"PROB": "0.1", "P": "1", "N": "3", "S": "2", "F": "5", "RATE": "1mbit", "G|G": "0,1|2,3"}


def sample(grammar: str) -> str:
    """A valid item of ``grammar`` for 4 peers and 10 rounds: kill:P@rN -> kill:1@r3."""
    text = grammar.replace("[@rN]", "").replace("[:S]", ":2")
    for token in ("G|G", "RATE", "PROB", "P", "S", "F"):
        text = text.replace(token, SAMPLE[token])
    return text.replace("@rN", "@r3").replace(":N", ":3")


def test_the_process_parser_knows_the_registrys_kinds_and_no_other() -> None:
    assert set(faults.names_for(virtual=False)) == {*faults.LIFE, *faults.BEHAVIOUR, *faults.STATIC, *faults.NETWORK}


@pytest.mark.parametrize("kind", [k for k in faults.KINDS if k.processes], ids=lambda k: k.name)
def test_each_kind_of_the_process_simulator_parses_as_its_grammar_says(kind: faults.FaultKind) -> None:
    spec = sample(kind.processes)
    if kind.name == "restart":
        spec = "kill:1@r2," + spec
    if kind.name == "heal":
        spec = "partition:0,1|2,3@r2," + spec
    faults.parse(spec, peers=4, rounds=10)


@pytest.mark.parametrize("kind", [k for k in faults.KINDS if k.virtual], ids=lambda k: k.name)
def test_each_kind_of_the_virtual_simulator_parses_as_its_grammar_says(kind: faults.FaultKind) -> None:
    spec = sample(kind.virtual)
    if kind.name == "restart":
        spec = "kill:1@r2," + spec
    if kind.name == "heal":
        spec = "partition:0,1|2,3@r2," + spec
    if kind.name == "claims":
        spec = "sybils:3," + spec
    assert scenario.parse_faults(spec, 4)


@pytest.mark.parametrize("kind", [k for k in faults.KINDS if not k.virtual], ids=lambda k: k.name)
def test_the_virtual_simulator_refuses_what_it_does_not_model(kind: faults.FaultKind) -> None:
    with pytest.raises(ValueError, match="not modelled by --virtual"):
        scenario.parse_faults(sample(kind.processes), 4)


def test_faults_help_lists_every_kind() -> None:
    out = CliRunner().invoke(app, ["simulate", "--faults", "help"]).output
    assert all(f"\n{k.name} " in out for k in faults.KINDS), out


def test_the_simulator_page_shows_the_registry() -> None:
    page = ROOT.joinpath("docs", "simulator.md").read_text()
    assert faults.markdown_table() in page, "docs/simulator.md: paste faults.markdown_table() in again"
