"""What the commands print, laid out for a person: widths, shortened names, wrapped lines, one progress display.

Expectations are written by hand (the shortened names) or read from the run's own --json document (the
words every wrapped warning must keep), never from the layout code under test.
"""

from __future__ import annotations

import io
import re

import pytest

from tests.cli_support import SAMPLES, SINGLE, cli, table_rows

LLAMA_LAYER = [f"model.layers.12.{p}.weight" for p in
               ("self_attn.q_proj", "self_attn.k_proj", "mlp.up_proj", "post_attention_layernorm")]


def reads(shown: str, name: str) -> bool:
    """Whether a shortened name can stand for `name`: each `…` stands for what was left out."""
    return re.fullmatch(".+".join(map(re.escape, shown.split("…"))), name) is not None


@pytest.mark.parametrize(("room", "expected"), [
    (40, "model.layers.12.self_attn.q_proj.weight"),
    (34, "…layers.12.self_attn.q_proj.weight"),
    (27, "…12.self_attn.q_proj.weight"),
    (24, "…12.…q_proj.weight"),
])
def test_a_long_name_loses_whole_parts_and_keeps_its_layer_and_projection(room, expected):
    from qcli.cli._output import fit_names

    assert fit_names(["model.layers.12.self_attn.q_proj.weight"], room) == [expected]


def test_shortened_names_never_read_alike():
    from qcli.cli._output import fit_names

    names = [f"{side}.layers.0.self_attn.q_proj.weight" for side in ("encoder", "decoder")]
    assert fit_names(names, 28) == ["encoder.…0.…q_proj.weight", "decoder.…0.…q_proj.weight"]
    names = LLAMA_LAYER + [n.replace(".weight", ".bias") for n in LLAMA_LAYER]
    shown = fit_names(names, 24)
    assert len(set(shown)) == len(names)
    assert all(len(s) <= 24 and sum(reads(s, n) for n in names) == 1 and reads(s, name)
               for s, name in zip(shown, names, strict=True)), shown
    # what the room cannot tell apart is shown whole
    names = ["x.aaaa.0.bbbb.cccc", "y.aaaa.0.bbbb.cccc"]
    assert fit_names(names, 8) == names


def test_at_60_columns_the_sqnr_column_stays_and_every_line_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    result = cli("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu", "--recipe",
                 SAMPLES / "tiny-llama.toml")
    assert result.code == 0, result.err
    # a path longer than a line is kept whole, on a line of its own
    assert [line for line in (result.out + result.err).splitlines() if len(line) > 60 and " " in line.strip()] == []
    header = result.out.splitlines()[0].split()
    assert "SQNR" in header and "shape" not in header
    assert "shape left out at this width" in result.out
    rows = table_rows(result.out)
    assert len(rows) == 21 and all(re.fullmatch(r"[0-9.]+|-", row[-1]) for row in rows)
    doc = cli("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu", "--recipe",
              SAMPLES / "tiny-llama.toml", "--json", "--force").json
    sqnr = sorted(f"{t['sqnr_db']:.1f}" for t in doc["tensors"] if t["sqnr_db"] is not None)
    assert sorted(row[-1] for row in rows if row[-1] != "-") == sqnr
    assert all(sum(reads(row[0], t["name"]) for t in doc["tensors"]) == 1 for row in rows)


def test_timings_are_never_split_inside_a_figure_and_warnings_only_between_words(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    args = ("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu", "--recipe", SAMPLES / "tiny-llama.toml")
    result = cli(*args)
    assert result.code == 0, result.err
    assert [line for line in (result.out + result.err).splitlines() if len(line) > 80 and " " in line.strip()] == []
    phases = re.findall(r"\b(read|quantize|stats|write|verify) \d+\.\d\d s, [0-9.e+-]+ GB/s", result.out)
    assert sorted(phases) == sorted(["read", "quantize", "stats", "write", "verify"]), result.out
    assert re.search(r"total \d+\.\d\d s on cpu", result.out)
    doc = cli(*args, "--json", "--force").json
    printed = " ".join(line.strip() for line in result.err.splitlines())
    for warning in doc["warnings"]:
        assert f"{warning['message']} (hint: {warning['hint']})" in printed
    assert len(result.err.splitlines()) > len(doc["warnings"])  # they were wrapped


def test_the_size_change_is_said_in_percent(tmp_path):
    result = cli("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu", "--json")
    totals = result.json["totals"]
    printed = cli("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu", "--force").out
    percent = round((1 - totals["bytes_out"] / totals["bytes_in"]) * 100)
    assert f"({percent} % smaller," in printed and "× smaller" not in printed


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_one_live_display_holds_every_phase_each_row_within_80_columns(monkeypatch):
    """Calibration and writing are rows of one display: rich never has two live at once, and every row
    drawn fits 80 columns."""
    from rich.console import Console
    from rich.live import Live

    from qcli.calibrate.runner import BlockDone
    from qcli.cli import _output

    screen = Terminal()
    monkeypatch.setattr(_output, "stderr", lambda: Console(file=screen, force_terminal=True, width=80))
    live, most = [0], [0]
    start, stop = Live.start, Live.stop

    def started(self, *args, **kwargs):
        live[0] += 1
        most[0] = max(most[0], live[0])
        return start(self, *args, **kwargs)

    def stopped(self, *args, **kwargs):
        live[0] -= 1
        return stop(self, *args, **kwargs)

    monkeypatch.setattr(Live, "start", started)
    monkeypatch.setattr(Live, "stop", stopped)
    with _output.run_progress(True) as progress:
        for done in range(3):
            progress.blocks(BlockDone(done, 2, 64, done * 2.0))
        progress._progress.refresh()
        for i, name in enumerate([*LLAMA_LAYER, None]):
            progress.tensors(name, i * 1000, 4000)
            progress._progress.refresh()
        rows = [task.description for task in progress._progress.tasks]
    assert most[0] == 1
    assert rows == ["calibrating", "finishing"]
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()).replace("\r", "\n").splitlines()
    assert any("2/2 blocks" in line for line in drawn) and any("…12.self_attn.q_proj.weight" in line for line in drawn)
    assert all(len(line) <= 80 for line in drawn), drawn
