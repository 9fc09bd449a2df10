"""``--prepare DIR``: wheels, plan.json and run.sh in an ignored folder of the repo, and what it all weighs."""

from __future__ import annotations

import json
import subprocess

import pytest

from fsdp_matrix.device import image, prepare
from tests.device.support import Index, fake_wheel


def _index(folder, pad):
    """Every site's wants as fake wheels; bitsandbytes weighs ``pad`` bytes."""
    for site in image.SITES:
        for want in site.wants:
            name, version = want.split("==")
            fake_wheel(folder, name, version, pad=pad if name == "bitsandbytes" else 0)
    return Index(folder)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text(".device/\n")
    (root / "tracked.txt").write_text("x" * 1000)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    (root / "untracked.txt").write_text("y" * 500)
    return root


def test_prepare_writes_wheels_plan_and_run_sh_and_says_the_total(repo, tmp_path):
    lines = []
    index = _index(tmp_path / "index", pad=1 << 20)
    result = prepare.prepare(repo, repo / ".device", index.download, say=lines.append)
    folder = repo / ".device"
    assert (folder / "run.sh").read_text() == prepare.RUN_SH.read_text()
    assert json.loads((folder / "plan.json").read_text())["schema"] == 1
    for site in image.SITES:
        assert len(list((folder / "wheels" / site.name).glob("*.whl"))) == len(site.wants)
    assert prepare.tree_bytes(repo) == len(".device/\n") + 1000 + 500  # the ignored folder does not count
    total = next(line for line in lines if line.startswith("total: "))
    assert "(limit 64.0 MiB)" in total and "= 1.0 MiB" in total
    # under the byte limit, calls split only by the 8 minutes each may take (plan.pack's estimates)
    assert sorted(s for c in result.calls for s in c.steps) == sorted(s.name for s in result.steps)
    first = result.calls[0]
    assert first.steps[:3] == ("merge-peft0.13.0", "merge-fixed", "cuda-cells")
    assert first.carry == (".device/run.sh", ".device/plan.json", *(f".device/wheels/{s}" for s in first.sites))
    assert set(first.sites) == {s.name for s in image.SITES}


def test_over_the_limit_the_plan_splits_into_calls_in_order_of_value(repo, tmp_path):
    index = _index(tmp_path / "index", pad=3 << 20)
    lines = []
    result = prepare.prepare(repo, repo / ".device", index.download, limit=4 << 20, say=lines.append)
    assert len(result.calls) > 1 and all(c.bytes <= 4 << 20 for c in result.calls)
    assert result.calls[0].steps[:2] == ("merge-peft0.13.0", "merge-fixed")
    assert f"split into {len(result.calls)} calls" in next(line for line in lines if line.startswith("total: "))
    assert all(".device/wheels/harness" in c.carry for c in result.calls)


def test_a_step_that_fits_no_call_is_refused(repo, tmp_path):
    index = _index(tmp_path / "index", pad=3 << 20)
    with pytest.raises(prepare.PrepareError, match="cannot fit"):
        prepare.prepare(repo, repo / ".device", index.download, limit=2 << 20, say=lambda _: None)


def test_a_folder_git_would_send_or_outside_the_repo_is_refused(repo, tmp_path):
    with pytest.raises(prepare.PrepareError, match="not ignored by git"):
        prepare.check_dir(repo, repo / "wheels-here")
    with pytest.raises(prepare.PrepareError, match="outside the repo"):
        prepare.check_dir(repo, tmp_path / "elsewhere")


def test_the_command_says_a_bad_folder_in_one_line(tmp_path, capsys):
    assert prepare.main(["--prepare", str(tmp_path / "elsewhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("device --prepare: ") and err.count("\n") == 1
