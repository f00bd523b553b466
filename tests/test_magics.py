"""The magics in a real in-process InteractiveShell."""

from __future__ import annotations

import subprocess
import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell

from mfs_nb.notebook.magics import parse_uid_range, substitute


@pytest.fixture
def ip(tmp_path, monkeypatch):
    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nbstore"))
    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell(config=cfg)
    shell.run_line_magic("load_ext", "mfs_nb")
    yield shell
    InteractiveShell.clear_instance()


def test_chat_recall_and_status(ip, capsys):
    ip.user_ns["limit"] = 30
    ip.run_cell_magic("chat", "", "Our DB allows 120 connections; keep the pool under {limit}.")
    out = capsys.readouterr()
    assert "No model is configured" in out.out
    assert "ctx " in out.out and "session default" in out.out
    ip.run_line_magic("recall", "1-2")
    out = capsys.readouterr().out
    assert "[#1 user · turn 1]\nOur DB allows 120 connections; keep the pool under 30." in out
    assert "[#2 assistant · turn 1]" in out
    ip.run_line_magic("recall", "1")
    assert "#2" not in capsys.readouterr().out
    ip.run_line_magic("mfs", "status")
    out = capsys.readouterr().out
    assert "2 events, last uid 2" in out and "answering: mfs-offline/default · key: none needed" in out
    assert "budget balanced (55%): a compaction ends at" in out and "(the offline default costs nothing)" in out
    ip.run_line_magic("mfs", "config budget=lean")
    capsys.readouterr()
    ip.run_line_magic("mfs", "status")
    assert "budget lean (40%)" in capsys.readouterr().out


def test_template_escapes_and_unknown_names(ip, capsys):
    ip.user_ns["x"] = 7
    ip.run_cell_magic("chat", "", "x={x} {{x}} {missing}")
    err = capsys.readouterr().err
    assert "{missing}" in err
    ip.run_line_magic("recall", "1")
    assert "x=7 {x} {missing}" in capsys.readouterr().out


def test_sessions_new_use_and_config(ip, capsys):
    ip.run_cell_magic("chat", "", "in default")
    ip.run_line_magic("mfs", "new side")
    ip.run_cell_magic("chat", "--no-stream", "in side")
    ip.run_line_magic("mfs", "sessions")
    out = capsys.readouterr().out
    assert "* side" in out and "  default" in out
    ip.run_line_magic("mfs", "config window_tokens=32k")
    assert "window_tokens = 32000" in capsys.readouterr().out
    ip.run_line_magic("mfs", "use default")
    assert "2 events" in capsys.readouterr().out
    ip.run_cell_magic("chat", "--session side", "explicit session")
    ip.run_line_magic("mfs", "use side")
    ip.run_line_magic("recall", "3")
    assert "explicit session" in capsys.readouterr().out


@pytest.mark.parametrize("call, needle", [
    (("cell", "chat", "", "   "), "empty"),
    (("cell", "chat", "", "x" * 5_000_000), "--doc PATH"),
    (("line", "recall", "abc"), "expected a uid"),
    (("cell", "chat", "--bogus", "hello"), "unknown option --bogus; known: --session"),
    (("line", "recall", "9-3"), "reversed"),
    (("line", "recall", "500"), "no events"),
    (("line", "mfs", "config window_tokens=lots"), "whole number"),
    (("line", "mfs", "config api_key=sk-123"), "never saved"),
    (("line", "mfs", "config nosuch=1"), "unknown setting"),
    (("line", "mfs", "open /nowhere/at/all --read-only"), "there is no store at /nowhere/at/all (nothing is there)"),
    (("line", "mfs", "open /tmp --readonly"), "unknown option --readonly; the one it takes is --read-only"),
    (("line", "mfs", "fork copy --store"), "name the writable store"),
], ids=["empty", "5MB", "recall-abc", "bad-option", "reversed", "unknown-uid", "bad-window", "key", "unknown-setting",
        "open-nowhere", "open-flag", "fork-store"])
def test_bad_input_is_one_line_on_stderr(ip, capsys, call, needle):
    ip.run_cell_magic("chat", "", "first")
    capsys.readouterr()
    kind, name, *args = call
    if kind == "cell":
        ip.run_cell_magic(name, *args)
    else:
        ip.run_line_magic(name, *args)
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    ip.run_cell_magic("chat", "", "still usable")
    ip.run_line_magic("recall", "3")
    assert "still usable" in capsys.readouterr().out


def test_mistakes_print_one_line_and_do_not_stop_run_all(ip, capsys):
    for cell in ("%recall abc", "%mfs frobnicate", "%%chat --bogus\nhello", "%%chat\n   ", "%mfs new 'unclosed"):
        result = ip.run_cell(cell)
        assert result.success, cell  # Run All goes on
    err = capsys.readouterr().err
    lines = err.strip().split("\n")
    assert len(lines) == 5 and all(line.startswith("mfs: ") for line in lines), err
    assert "UsageError" not in err and "Traceback" not in err


def test_an_empty_chat_cell_is_one_line_not_a_usage_error(ip, capsys):
    """IPython refuses an empty cell-magic body itself, before %%chat runs, with a UsageError that
    stops Run All; the extension gives the body a blank line so %%chat's own line answers."""
    for cell in ("%%chat", "%%chat\n", "%%chat --no-stream", "%%chat --session side\n\n"):
        result = ip.run_cell(cell)
        assert result.success, cell
    err = capsys.readouterr().err
    lines = err.strip().split("\n")
    assert len(lines) == 4 and all(line.startswith("mfs: the %%chat cell is empty") for line in lines), err
    assert ip.run_cell("x = 1\nx").success  # other cells untouched
    ip.run_line_magic("unload_ext", "mfs_nb")
    assert ip.run_cell("%%chat").success is False  # the transformer comes off with the extension


def test_config_traitlets_validate_before_applying(ip, caplog):
    magics = ip.magics_manager.registry["MfsMagics"]
    ip.run_cell("%config MfsMagics.window_tokens = 16000")
    ip.run_cell_magic("chat", "", "hello")
    assert magics.get_session().window == 16000
    ip.run_cell("%config MfsMagics.window_tokens = 12")
    assert magics.window_tokens == 16000 and magics.get_session().window == 16000
    assert "out of range" in caplog.text


def test_load_ext_is_fast_and_imports_no_heavy_modules():
    code = ("from IPython.core.interactiveshell import InteractiveShell; import sys; "
            "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'mfs_nb'); "
            "print(sorted(m for m in ('litellm', 'lancedb', 'torch', 'tiktoken') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_parsers():
    assert parse_uid_range("102-140") == (102, 140)
    assert parse_uid_range("102 140") == (102, 140)
    assert parse_uid_range("#102") == (102, None)
    assert substitute("{{a}} {b}", {"b": 1}) == ("{a} 1", [])


def test_chat_channels_and_gc(ip, capsys, tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\nthe pool is 30\n")
    ip.run_cell_magic("chat", f"--doc {doc}", "What does the note say?")
    capsys.readouterr()
    session = ip.find_magic("mfs", "line").__self__.get_session()
    verdict = session.verbatim.verdicts[1]
    assert verdict.disposition == "document" and verdict.snapshots[0]["path"].endswith("-notes.md")
    ip.run_cell_magic("chat", "--quote", "No model is configured\n---\nwhy not?")
    assert session.verbatim.verdicts[3].disposition == "quote+note"
    ip.run_cell_magic("chat", f"--doc {tmp_path / 'missing.md'}", "x")
    assert "mfs: --doc" in capsys.readouterr().err and len(session.events) == 4  # nothing recorded
    ip.run_line_magic("mfs", "gc --dry-run")
    assert "no unreferenced snapshots" in capsys.readouterr().out


def _restart(ip):
    """A new kernel on the same store: a fresh shell with the extension loaded again."""
    from traitlets.config import Config

    InteractiveShell.clear_instance()
    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell(config=cfg)
    shell.run_line_magic("load_ext", "mfs_nb")
    return shell


def test_settings_follow_the_person_across_new_use_fork_and_restart(ip, capsys):
    """The model and endpoint are the notebook's: a new session, a fork and a restart keep them; a
    session keeps its own only when told (--session); %mfs use does not create a session by typo."""
    def current(shell):
        return shell.magics_manager.registry["MfsMagics"].get_session()

    model, base = "openai/gpt-4o-mini", "http://127.0.0.1:9/v1"
    ip.run_cell("%%chat\nhello")
    ip.run_line_magic("mfs", f"config model={model} api_base={base}")
    ip.run_line_magic("mfs", "new side")
    assert (current(ip).name, current(ip).settings.model, current(ip).settings.api_base) == ("side", model, base)
    capsys.readouterr()
    assert ip.run_cell("%mfs use sid").success
    err = capsys.readouterr().err
    assert err.startswith("mfs: ") and "no session 'sid'" in err and "did you mean side?" in err
    assert "sid" not in ip.magics_manager.registry["MfsMagics"]._get_store().sessions()
    assert current(ip).name == "side"
    ip.run_line_magic("mfs", "use default")
    assert current(ip).settings.model == model  # opened before the config: it follows too
    ip.run_line_magic("mfs", "config --session model=openai/own-model")
    ip.run_line_magic("mfs", "status")
    out = capsys.readouterr().out
    assert "model 'openai/own-model' from this session's own" in out
    assert f"api_base '{base}' from this notebook" in out
    ip.run_line_magic("mfs", "use side")
    ip.run_cell("%%chat\nin side")  # the endpoint does not answer: kept in the log, one line
    ip.run_line_magic("mfs", "fork other")
    assert (current(ip).name, current(ip).settings.model, current(ip).settings.api_base) == ("other", model, base)

    ip = _restart(ip)
    assert (current(ip).name, current(ip).settings.model, current(ip).settings.api_base) == ("other", model, base)
    ip.run_line_magic("mfs", "new third")
    assert current(ip).settings.model == model
    ip.run_line_magic("mfs", "use default")
    assert current(ip).settings.model == "openai/own-model"  # kept as its own across the restart
    ip.run_line_magic("mfs", "new 'bad name'")
    assert "invalid" in capsys.readouterr().err and current(ip).name == "default"


def test_a_mistyped_model_or_flag_is_caught_where_it_is_made(ip, capsys):
    """Issue 71: a provider typo is refused by `%mfs config` with the near miss, not accepted and then
    failed by litellm on the next call; a mistyped flag names the flag it was probably meant to be."""
    ip.run_line_magic("mfs", "config model=opnai/gpt-4o-mini")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mfs: ") and "did you mean openai/gpt-4o-mini?" in err, err
    magics = ip.magics_manager.registry["MfsMagics"]
    assert magics.get_session().settings.model == "mfs-offline/default"  # nothing changed
    ip.run_line_magic("mfs", "config model=openai/gpt-4o-mini")
    assert "every session of this notebook" in capsys.readouterr().out
    ip.run_cell("%config MfsMagics.model = 'antropic/claude-3-5-haiku'")
    assert magics.model != "antropic/claude-3-5-haiku"
    ip.run_cell_magic("chat", "--sesion x", "hello")
    err = capsys.readouterr().err
    assert err.strip() == "mfs: %%chat: unknown option --sesion; did you mean --session?", err
    ip.run_line_magic("compact", "--peview")
    assert "did you mean --preview?" in capsys.readouterr().err
    ip.run_cell_magic("chat", "--zzz", "hello")
    assert "known: --session, --model" in capsys.readouterr().err
