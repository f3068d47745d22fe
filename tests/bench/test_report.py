"""bench/_report: write_json, the JSON tail the bench scripts share -- the bytes each script
wrote before it (json.dumps at the script's indent, key order kept) plus one trailing
newline, parent folders created -- and git_commit, the commit a result names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.bench.scripts import BENCH, load_script

report = load_script("_report.py")

RESULT = {"zeta": 1, "alpha": [1.5, {"b": None, "a": True}], "name": "SmolLM2 µs",
          "empty": {}, "rows": [[1, 2], []]}


@pytest.mark.parametrize("indent", [1, 2])
def test_the_bytes_are_json_dumps_at_the_indent_with_a_trailing_newline(tmp_path, indent):
    path = tmp_path / "deep" / "er" / "out.json"
    assert report.write_json(path, RESULT, indent=indent) == path
    assert path.read_bytes() == (json.dumps(RESULT, indent=indent) + "\n").encode()
    assert list(json.loads(path.read_text())) == ["zeta", "alpha", "name", "empty", "rows"]


def test_the_default_indent_is_one_and_a_str_path_works(tmp_path):
    path = report.write_json(str(tmp_path / "a.json"), [1, {"x": 2}])
    assert path.read_text() == '[\n 1,\n {\n  "x": 2\n }\n]\n'


def test_a_default_encodes_other_values_and_without_it_nothing_is_written(tmp_path):
    path = tmp_path / "p.json"
    report.write_json(path, {"path": Path("/x"), "nan": math.nan}, default=str)
    assert path.read_text() == '{\n "path": "/x",\n "nan": NaN\n}\n'
    with pytest.raises(TypeError, match="Object of type PosixPath is not JSON serializable"):
        report.write_json(tmp_path / "new" / "q.json", {"path": Path("/x")})
    assert not (tmp_path / "new").exists()  # encoded before any folder or file is made


def test_git_commit_names_a_checkouts_head_and_none_outside_one(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.delenv("HELIOS_COMMIT", raising=False)

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    assert report.git_commit(tmp_path) is None  # no checkout here
    git("init", "-q")
    assert report.git_commit(tmp_path) is None  # a checkout with no commit yet
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    assert report.git_commit(tmp_path) == git("rev-parse", "--short", "HEAD")
    assert report.git_commit() == subprocess.run(
        ["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True).stdout.strip()


def test_git_commit_outside_a_checkout_reads_helios_commit(tmp_path, monkeypatch):
    """The device machine's copy has no usable .git: the caller names the commit, and
    the name wins over a checkout's HEAD."""
    monkeypatch.setenv("HELIOS_COMMIT", "062c372")
    assert report.git_commit(tmp_path) == "062c372"
    assert report.git_commit() == "062c372"
    monkeypatch.setenv("HELIOS_COMMIT", "")
    assert report.git_commit(tmp_path) is None
