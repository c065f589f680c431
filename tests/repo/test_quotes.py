"""Every measured number README.md and docs/ quote is the number in its committed results file.

A quoted number carries an HTML comment right after it (invisible on the rendered page) that names where it comes
from; this test recomputes it and compares it with the text as written, rounded the way it is written:

    54,028<!-- quote: benchmarks/2xH200/sweeps/adamw_ab_repeat2.json ddp:tokens_per_s shipped -->
    93%<!-- quote: benchmarks/2xH200/sweeps/adamw_ab_repeat2.json z2t:tokens_per_s/ddp:tokens_per_s shipped -->
    1.17x<!-- quote: benchmarks/1xH200/long_context/results.json $summary.strongest_baseline.max_seq_ratio -->

- ``ROW:FIELD`` is the field (dotted: ``memory.peak_gib``) of the row named ROW in the file's ``results``;
  ``A/B`` is a ratio of two such values, and both rows must come from the same launch (the file's ``runs``).
  ``$a.b.0.c`` is a plain JSON path, for files that are not harness results.
- A row quote says what the row is: ``shipped`` (the preset exactly as ``recipes/`` ships it, or the Trainer's
  own DDP / FSDP; only the batch may differ) or ``differs=KEY,...`` (exactly those top-level keys of the
  DeepSpeed config, or of the setup: ``args``, ``env``, ...; ``base`` for a config that is no preset), which the
  text next to the number must say. The row a ratio divides by may differ in those keys, or fewer, unless a
  second ``shipped`` / ``differs=`` names exactly how it differs.
- A row quoted for its speed (``tokens_per_s``) must train as DDP does: its mean loss within the harness's
  LOSS_TOLERANCE of the DDP row of the same file and gradient-checkpointing setting, where both logged losses.
- The number is the one written right before the comment: ``54,028``, ``20.22``, ``93%`` (a fraction written as
  a percentage), ``54.0k`` (thousands), ``1.17x``; its decimals and thousands separators set the rounding.

Every number in a table of README's Results section must carry a quote. Pure Python (the harness's report module
and the preset loader, no torch import): it runs in about a second.
"""

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUOTE = re.compile(r"<!--\s*quote:\s*(.*?)\s*-->")
# the number right before a quote: 54,028 / 20.22 / 93% / 54.0k / 1.17x, possibly in bold
WRITTEN = re.compile(r"(?<![\d.,])(\d[\d,]*(?:\.\d+)?)(%|k|x)?\**\s*$")
_SETUP_EXTRAS = ("args", "env", "dynamo", "lora", "data", "callback", "long_context")
_BATCH_ARGS = {"gradient_accumulation_steps"}


def quoted_docs(root: Path = ROOT) -> list:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("**/*.md"))] if p.is_file()]


def quotes(path: Path) -> list:
    """(line number, text before the comment, the comment's spec) for each quote of a Markdown file."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for match in QUOTE.finditer(line):
            before = QUOTE.sub("", line[: match.start()])
            found.append((number, before, match.group(1)))
    return found


@lru_cache(maxsize=None)
def load(relative: str) -> dict:
    return json.loads((ROOT / relative).read_text(encoding="utf-8"))


def dig(value, dotted: str):
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def row_of(data: dict, name: str) -> dict:
    rows = [r for r in data.get("results", []) if r.get("name") == name]
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} rows named {name!r}")
    return rows[0]


def launch(data: dict, row: dict) -> int:
    """Index of the launch (entry of ``runs``, by date) that measured a row."""
    dates = sorted(run["date"] for run in data.get("runs", []))
    started = [i for i, date in enumerate(dates) if date <= (row.get("date") or "")]
    return started[-1] if started else -1


def config_differences(row: dict) -> set:
    """Top-level keys where a row's DeepSpeed config (and setup) differ from what ships for its base."""
    from hf_zero.config.presets import load_config
    from hf_zero.errors import ConfigError

    setup = row.get("setup") or {}
    # the batch may differ; the Trainer's FSDP is set up through its fsdp* arguments
    own = _BATCH_ARGS | ({key for key in setup.get("args") or {} if key.startswith("fsdp")}
                         if row.get("kind") == "fsdp" else set())
    found = {key for key in _SETUP_EXTRAS if setup.get(key) and not (key == "args" and set(setup[key]) <= own)}
    ours = setup.get("deepspeed")
    if row.get("kind") in ("ddp", "fsdp"):
        return found | ({"deepspeed"} if ours else set())
    try:
        shipped = load_config(row["base"])
    except ConfigError:  # a base that is no preset (an HF "auto" config): the quote says differs=base
        return found | {"base"}
    return found | {key for key in set(ours or {}) | set(shipped) if (ours or {}).get(key) != shipped.get(key)}


def _mean(values):
    return sum(values) / len(values) if values else None


def trains_as_ddp(data: dict, row: dict) -> str | None:
    """Why a row is not quotable as speed (it trained differently from DDP), or None."""
    from benchmarks.harness.report import LOSS_TOLERANCE

    if row.get("kind") == "ddp" or "scheduler" in ((row.get("setup") or {}).get("deepspeed") or {}):
        return None
    ddp_name = "ddp+gc" if row.get("gradient_checkpointing") else "ddp"
    ddp = next((r for r in data.get("results", []) if r.get("name") == ddp_name and r.get("status") == "ok"), None)
    ours, theirs = _mean(row.get("losses") or []), _mean((ddp or {}).get("losses") or [])
    if ours is None or theirs is None or abs(ours - theirs) <= LOSS_TOLERANCE:
        return None
    return f"its mean loss is {ours - theirs:+.3f} from DDP's: it trained differently, so its speed is not quotable"


def value_of(spec: str) -> float:
    """The number a quote's spec names; raises ValueError with the reason when the quote is wrong."""
    parts = spec.split()
    if len(parts) < 2:
        raise ValueError("expected 'FILE ROW:FIELD[/ROW:FIELD] shipped|differs=KEYS' or 'FILE $json.path'")
    path, expr, kind = parts[0], parts[1], parts[2:]
    if not (ROOT / path).is_file():
        raise ValueError(f"{path}: no such file")
    data = load(path)
    if expr.startswith("$"):
        try:
            return float(dig(data, expr[1:]))
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: no number at {expr} ({e!r})") from None
    if len(kind) not in (1, 2) or not all(k == "shipped" or k.startswith("differs=") for k in kind):
        raise ValueError("a row quote says 'shipped' or 'differs=KEY,...' after the field (and may say it again "
                         "for the row a ratio divides by)")
    saids = [set() if k == "shipped" else set(k[len("differs="):].split(",")) for k in kind]
    values, rows = [], []
    for index, term in enumerate(expr.split("/")):
        said = saids[min(index, len(saids) - 1)]
        name, _, field = term.partition(":")
        try:
            row = row_of(data, name)
            values.append(float(dig(row, field)))
        except (LookupError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: {term}: {e}") from None
        if row.get("status") != "ok":
            raise ValueError(f"{path}: row {name!r} did not run ({row.get('status')})")
        differs = config_differences(row)
        # the quoted row differs exactly as said; the row a ratio divides by differs in no more than that
        if differs != said if not rows or len(saids) == 2 else not differs <= said:
            raise ValueError(f"{path}: row {name!r} differs from what ships in {sorted(differs) or 'nothing'}, "
                             f"the quote says {sorted(said) or 'shipped'}")
        if field == "tokens_per_s":
            why = trains_as_ddp(data, row)
            if why:
                raise ValueError(f"{path}: row {name!r}: {why}")
        rows.append(row)
    if len({launch(data, row) for row in rows}) > 1:
        raise ValueError(f"{path}: {expr}: a ratio of rows from different launches")
    return values[0] / values[1] if len(values) == 2 else values[0]


def rendered(value: float, written: str, suffix: str | None) -> str:
    """The value written the way the doc writes it."""
    scaled = {"%": value * 100, "k": value / 1000}.get(suffix, value)
    decimals = len(written.split(".")[1]) if "." in written else 0
    return format(scaled, f"{',' if ',' in written else ''}.{decimals}f")


def problems(path: Path) -> list:
    found = []
    for number, before, spec in quotes(path):
        where = f"{path.relative_to(ROOT) if ROOT in path.parents else path}:{number}"
        match = WRITTEN.search(before)
        if not match:
            found.append(f"{where}: no number right before the quote ({spec})")
            continue
        written, suffix = match.group(1), match.group(2)
        try:
            value = value_of(spec)
        except ValueError as e:
            found.append(f"{where}: {e}")
            continue
        expected = rendered(value, written, suffix)
        if expected != written:
            found.append(f"{where}: writes {written}{suffix or ''}, {spec.split()[0]} gives {expected}{suffix or ''}")
    return found


def unquoted_table_numbers(path: Path, section: str) -> list:
    """Table cells with a digit and no quote in one section of a Markdown file."""
    found, inside = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("## "):
            inside = line.strip() == section
        if not inside or not line.startswith("|") or set(line) <= set("|-: "):
            continue
        for cell in line.strip().strip("|").split("|")[1:]:  # the first cell names the setup
            # a baseline's own 100% and row names in code spans are not measurements
            bare = re.sub(r"`[^`]*`", "", QUOTE.sub("", cell)).strip()
            if re.search(r"\d", bare) and bare != "100%" and not QUOTE.search(cell):
                found.append(f"{path.relative_to(ROOT)}:{number}: unquoted number in {cell.strip()!r}")
    return found


@pytest.mark.parametrize("doc", quoted_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_numbers_match_their_results_file(doc):
    assert problems(doc) == []


def test_the_readme_results_tables_quote_every_number():
    assert unquoted_table_numbers(ROOT / "README.md", "## Results") == []


def test_the_quotes_cover_the_headline_pages():
    counts = {name: len(quotes(ROOT / name)) for name in ("README.md", "docs/performance.md", "docs/long-context.md",
                                                          "docs/offload.md")}
    assert all(counts.values()), counts


def test_a_changed_number_fails(tmp_path):
    doc = tmp_path / "page.md"
    spec = "benchmarks/2xH200/sweeps/adamw_ab_repeat2.json ddp:tokens_per_s shipped"
    right = f"{load(spec.split()[0])['results'][0]['tokens_per_s']:,.0f}"
    doc.write_text(f"| DDP | {right}<!-- quote: {spec} --> |\n| DDP | 1{right}<!-- quote: {spec} --> |\n")
    found = problems(doc)
    assert len(found) == 1 and f"writes 1{right}, " in found[0]


def test_a_row_that_is_not_what_it_claims_fails(tmp_path):
    doc = tmp_path / "page.md"
    # results.json's zero2 ran with an optimizer block; saying "shipped" is wrong, naming it is right
    doc.write_text("55,832<!-- quote: benchmarks/2xH200/results.json zero2:tokens_per_s shipped -->\n"
                   "55,832<!-- quote: benchmarks/2xH200/results.json zero2:tokens_per_s differs=optimizer -->\n")
    found = problems(doc)
    assert len(found) == 1 and "differs from what ships in ['optimizer']" in found[0]


def test_a_row_that_trained_differently_is_not_speed(tmp_path):
    doc = tmp_path / "page.md"
    spec = ("benchmarks/2xH200/results.json zero3:tokens_per_s "
            "differs=optimizer,zero_optimization")
    doc.write_text(f"34,971<!-- quote: {spec} -->\n")
    found = problems(doc)
    assert len(found) == 1 and "trained differently" in found[0]


def test_a_ratio_across_launches_fails(tmp_path):
    doc = tmp_path / "page.md"
    # results.json's ddp+gc ran in an earlier launch than its ddp
    doc.write_text("99%<!-- quote: benchmarks/2xH200/results.json ddp+gc:tokens_per_s/ddp:tokens_per_s shipped -->\n")
    found = problems(doc)
    assert len(found) == 1 and "different launches" in found[0]

