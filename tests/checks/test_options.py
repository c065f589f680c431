"""The options both doors take, declared once (hf_zero.checks.options.ZeroOptions): ZeroCallback, hf_zero.attach and
hf_zero.prepare take exactly its fields with its defaults, refuse other names with one TypeError, and the docs table
lists exactly its fields with each door's default."""

import inspect
from dataclasses import fields

import pytest

import hf_zero
from conftest import REPO
from hf_zero.checks import ZeroOptions
from hf_zero.errors import ConfigError

DOORS = {"trainer": hf_zero.ZeroCallback, "accelerate": hf_zero.prepare}


def _shown(value) -> str:
    """A default as the docs write it."""
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def docs_table() -> dict:
    """docs/callback.md's options table: option -> (ZeroCallback's default, hf_zero.prepare's), as written."""
    page = (REPO / "docs" / "callback.md").read_text()
    section = page.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `")]
    return {name.strip().strip("`"): (trainer.strip(), loop.strip()) for name, trainer, loop in rows}


def test_the_docs_table_lists_exactly_the_options_with_each_doors_default():
    table = docs_table()
    assert list(table) == [f.name for f in fields(ZeroOptions)]
    for name, written in table.items():
        expected = tuple(_shown(ZeroOptions.default(name, door)) if name in ZeroOptions.names(door) else "—"
                         for door in DOORS)
        assert written == expected, name


@pytest.mark.parametrize("door", DOORS)
def test_each_door_takes_the_options_by_name_with_its_defaults(door):
    parameters = inspect.signature(DOORS[door]).parameters
    keywords = {name: p.default for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == {name: ZeroOptions.default(name, door) for name in ZeroOptions.names(door)}
    assert ZeroOptions.for_door(door, {}) == ZeroOptions(**{name: ZeroOptions.default(name, door)
                                                           for name in ZeroOptions.__dataclass_fields__})


def test_the_callback_keeps_its_options_as_plain_values_it_takes_back():
    callback = hf_zero.ZeroCallback(skip_checks=["host-memory", "built-whole"], long_context={"tiled_mlp": False},
                                    offload_threads=4)
    assert callback.options["skip_checks"] == ["built-whole", "host-memory"]
    assert callback.options["long_context"] == {"tiled_mlp": False, "fused_loss": True, "offload_activations": True}
    assert hf_zero.ZeroCallback(**callback.options).options == callback.options  # a checkpoint's ExportableState


def test_an_unknown_option_is_one_type_error_naming_the_doors_options():
    with pytest.raises(TypeError, match=r"ZeroCallback\(\) got unknown options 'cast_adapter' \(did you mean "
                                        r"'cast_adapters'\?\), 'colour'\. Its options: log_memory, .*skip_checks"):
        hf_zero.ZeroCallback(cast_adapter=False, colour="red")
    with pytest.raises(TypeError, match=r"hf_zero.prepare\(\) got an unknown option 'log_memory' \(an option of "
                                        r"ZeroCallback only\)"):
        hf_zero.prepare(None, None, log_memory=False)  # refused before the Accelerator is read


def test_bad_values_are_one_config_error_naming_each():
    with pytest.raises(ConfigError) as e:
        hf_zero.ZeroCallback(cast_adapters=2, offload_threads=-1, moe_leaves=False, skip_checks="host-memory")
    assert len(e.value.problems) == 4
    for words in ("cast_adapters must be true or false", "offload_threads must be auto or a thread count",
                  "moe_leaves must be one of", "skip_checks='host-memory' is one string"):
        assert any(words in problem for problem in e.value.problems), words
    with pytest.raises(ConfigError, match="long_context: unknown part"):
        hf_zero.ZeroCallback(long_context={"tiled": True})
    for fine in (dict(offload_threads=None), dict(offload_threads=0), dict(offload_threads=8), dict(cast_adapters=False)):
        hf_zero.ZeroCallback(**fine)
