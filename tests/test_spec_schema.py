"""The JSON Schema of the relation spec (dlverify/schemas/spec.schema.json)
accepts exactly what dlverify/spec.py accepts: every shipped spec and every
spec `dlverify spec` writes validate; the hostile specs that spec.py rejects
for their structure are rejected by the schema too."""
import json
import tomllib
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from dlverify.errors import InputError
from dlverify.spec import parse_spec

DATA = Path(__file__).resolve().parent / "data"
SCHEMA = json.loads(resources.files("dlverify").joinpath("schemas", "spec.schema.json").read_text())
SHIPPED = sorted(p for d in ("neuron_llama", "torch_xla", "xla_uneven") for p in (DATA / d).glob("*.toml"))
HOSTILE = sorted((DATA / "hostile" / "specs").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_specs_validate(path):
    jsonschema.validate(tomllib.loads(path.read_text()), SCHEMA)


def test_written_spec_validates():
    from dlverify.spec_writer import infer_spec
    text = infer_spec(DATA / "neuron_llama" / "tp1_layer1.hlo",
                      DATA / "neuron_llama" / "tp2_layer1.hlo").text
    jsonschema.validate(tomllib.loads(text), SCHEMA)


def _toml(path: Path):
    """The TOML document, or None when the file is not TOML at all (the schema is
    about documents; such files are the reader's exit-2 cases in test_hostile)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None


DOCS = [p for p in HOSTILE if _toml(p) is not None]
# JSON Schema's "integer" counts a float with an integral value (1e300) as an
# integer; TOML keeps them apart and the reader rejects every float rank
INTEGRAL_FLOATS = {"ranks_huge_float.toml"}


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_schema_and_reader_agree_on_hostile_specs(path):
    doc = _toml(path)
    try:
        parse_spec(path.read_text(encoding="utf-8"), str(path))
        read = True
    except InputError:
        read = False
    valid = jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
    if path.name in INTEGRAL_FLOATS:
        assert valid and not read
        return
    assert valid == read, (valid, read)
