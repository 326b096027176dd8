"""``python -m a2trio.inspect bulk`` (issue 35): redrive or skip every dead
letter a filter matches from the command line, with a dry run, as a table
and as camelCase JSON."""

from __future__ import annotations

import json

import pytest

from a2trio.inspect import main
from tests.test_inspect_cli_actions import _worker, app

__all__ = ["_worker", "app"]  # the fixture: s1 #1 dead (blocking #2), s2 #1 dead


def test_a_dry_run_lists_the_matches_and_touches_nothing(
    app: tuple[str, str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, _ = app
    cli = ["--app", name, "--store", url]
    assert main([*cli, "bulk", "redrive", "--error", "cannot run", "--dry-run"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["session", "index", "type", "outcome", "why"]
    assert [line.split() for line in table[1:3]] == [
        ["s1", "1", "job", "matched"],
        ["s2", "1", "job", "matched"],
    ]
    assert table[3] == "(dry run: nothing touched; matched 2, acted 0, refused 0)"
    assert (
        main([*cli, "--json", "bulk", "skip", "--prefix", "s2", "--dry-run", "--reason", "x"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert (result["dryRun"], result["matched"], result["items"][0]["sessionId"]) == (
        True,
        1,
        "s2",
    )
    assert main([*cli, "--json", "dead-letters"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [d["actions"] for d in page["deadLetters"]] == [[], []], "nothing recorded"


def test_a_bulk_redrive_records_each_action_with_by_and_reason(
    app: tuple[str, str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, _ = app
    cli = ["--app", name, "--store", url]
    argv = [*cli, "--json", "bulk", "redrive", "--all", "--by", "ann", "--reason", "v2"]
    argv += ["--limit", "1"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["matched"], result["acted"], result["limited"]) == (1, 1, True)
    [item] = result["items"]
    assert (item["sessionId"], item["outcome"], item["action"]["by"]) == ("s1", "acted", "ann")
    assert main([*cli, "bulk", "redrive", "--all", "--by", "ann"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["s2", "1", "job", "acted"]
    assert lines[2] == "(redrive; matched 1, acted 1, refused 0)"
    assert main([*cli, "--json", "events", "s1"]) == 0
    first = json.loads(capsys.readouterr().out)["events"][0]
    assert [(a["action"], a["by"], a["reason"]) for a in first["actions"]] == [
        ("redrive", "ann", "v2")
    ]


def test_bad_filters_are_one_line_errors(
    app: tuple[str, str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, _ = app
    cli = ["--app", name, "--store", url]
    for argv, message in (
        (["bulk", "redrive"], "an empty filter would redrive every dead letter"),
        (["bulk", "redrive", "--from", "yesterday"], "--from takes ISO 8601 with an offset"),
        (["bulk", "redrive", "--until", "2026-12-01T09:00"], "--until takes ISO 8601"),
        (
            ["bulk", "redrive", "--from", "2026-12-02T00:00Z", "--until", "2026-12-01T00:00Z"],
            "the time range ends before it starts",
        ),
        (["bulk", "redrive", "--all", "--limit", "0"], "limit is 1 to 10000"),
        (["bulk", "skip", "--all"], "`reason` must not be empty"),
    ):
        assert main([*cli, *argv]) == 1, argv
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("a2trio.inspect: ")
        assert message in line
    assert main([*cli, "bulk", "redrive", "--from", "1700000000000", "--dry-run"]) == 0
    assert "matched 2" in capsys.readouterr().out
