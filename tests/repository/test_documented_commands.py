"""Every command docs/RESULTS.md and docs/benchmarks.md quote still parses: the benchmark module or
study config exists and its command line accepts the flags as written (issue 42: a refactor that
renames a module or drops a flag must not leave a results section whose command no longer runs).

A command is parsed, never run: ``argparse`` is stopped right after it has read the arguments.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT
PAGES = ("docs/RESULTS.md", "docs/benchmarks.md")
COMMAND = re.compile(r"(python -m benchmarks\.[\w.]+|avalanche-study \w+)")


class _Parsed(Exception):
    """Raised by the patched parser once the arguments are read: the command parses."""


def _commands(text: str) -> list[str]:
    """The commands of a page: code-block lines (continuations joined, ``VAR="..."`` unwrapped) and
    inline code spans, cut at ``#``, ``&&``, ``|`` and ``;``; a command holding a shell variable is
    left out (its value is set elsewhere), and so is a subcommand named in prose without arguments."""
    text = text.replace("\\\n", " ")
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    candidates = re.findall(r"`([^`\n]+)`", prose) + [line for block in blocks for line in block.splitlines()]
    out = []
    for candidate in candidates:
        candidate = re.sub(r'^\s*\w+="(.*)"\s*$', r"\1", candidate)
        match = COMMAND.search(candidate)
        if not match:
            continue
        command = re.split(r"\s(?:#|&&|\||;)", candidate[match.start():])[0].strip().rstrip("`").strip()
        named_only = command.startswith("avalanche-study") and len(command.split()) == 2  # "(`avalanche-study run`)"
        if "$" not in command and "NAME" not in command and "..." not in command and not named_only:
            out.append(" ".join(command.split()))
    return sorted(set(out))


COMMANDS = [c for page in PAGES for c in _commands((ROOT / page).read_text(encoding="utf-8"))]


def _parse(argv_main, argv, monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        parsed = original(self, args, namespace)
        raise _Parsed(parsed)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    with pytest.raises(_Parsed) as parsed:
        argv_main(argv)
    return parsed.value.args[0]


def test_the_pages_quote_commands_of_both_kinds():
    assert sum(c.startswith("python -m benchmarks.") for c in COMMANDS) >= 30
    assert sum(c.startswith("avalanche-study ") for c in COMMANDS) >= 8
    sample = 'x\n```bash\nG="python -m benchmarks.a --b 1 \\\n  --c"\n$G --d\n```\nsee `avalanche-study run s.yaml` # y'
    assert _commands(sample) == ["avalanche-study run s.yaml", "python -m benchmarks.a --b 1 --c"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_documented_command_parses(command, monkeypatch, capsys):
    words = shlex.split(command)
    if words[0] == "avalanche-study":
        from avalanche_plugins.study.cli import main

        args = _parse(main, words[1:], monkeypatch)
        config = getattr(args, "config", None)
        if words[1] == "run" and config is not None:
            assert (ROOT / config).is_file(), f"{command}: no file {config}"
        return
    module = importlib.import_module(words[2])
    main = getattr(module, "main", None) or importlib.import_module(f"{words[2]}.main").main
    _parse(main, words[3:], monkeypatch)


def test_a_command_with_a_flag_its_benchmark_lacks_is_refused(monkeypatch, capsys):
    from benchmarks.lae_costs import main

    assert _parse(main, ["--threads", "1"], monkeypatch).threads == 1
    with pytest.raises(SystemExit):
        _parse(main, ["--no-such-flag"], monkeypatch)
