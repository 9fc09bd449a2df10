"""One install: the CUDA-build refusal and opt-in, the download announcement, the heartbeat."""

import time

from fsdp_matrix.envs import downloads, installer, uvproc


def fake_uv(monkeypatch, dry_output: str, calls: list, delay: float = 0.0):
    def run_uv(args, env, timeout):
        calls.append("dry-run" if "--dry-run" in args else "install")
        time.sleep(delay if "--dry-run" not in args else 0)
        return uvproc.UvRun(0, dry_output, timeout)

    monkeypatch.setattr(installer, "run_uv", run_uv)


CUDA_DRY_RUN = "Would install 3 packages\n + nvidia-cublas-cu12==12.4.5.8\n + torch==2.6.0\n + triton==3.2.0\n"


def test_cuda_packages_in_a_dry_run_are_caught():
    out = (
        "Would install 3 packages\n + nvidia-cublas-cu12==12.4.5.8\n + torch==2.13.0\n + triton==3.7.1\n"
        " + peft==0.21.2\n"
    )
    assert installer.cuda_packages(out) == ["nvidia-cublas-cu12", "triton"]
    assert installer.cuda_packages(" + torch==2.13.0+cpu\n + peft==0.21.2\n") == []


def test_default_combos_still_refuse_a_cuda_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("FSDP_MATRIX_TORCH_CPU_INDEX", "")  # no CPU index to fall back on (see test_cpu_torch.py)
    calls: list = []
    fake_uv(monkeypatch, CUDA_DRY_RUN, calls)
    result = installer.install(tmp_path / "bin" / "python", ["torch==2.6.0"], device="cpu")
    assert not result.ok and "refusing to download a CUDA build" in result.output
    assert calls == ["dry-run"]


def test_opted_in_combo_announces_the_download_before_it_starts(monkeypatch, tmp_path, capsys):
    calls: list = []
    fake_uv(monkeypatch, CUDA_DRY_RUN, calls)
    estimate = downloads.Estimate(3, 3_100_000_000, 0)
    monkeypatch.setattr(downloads, "estimate", lambda out, env, where: calls.append("estimate") or estimate)
    result = installer.install(
        tmp_path / "bin" / "python", ["torch==2.6.0"], device="cpu", allow_cuda_build=True, label="torch2.6"
    )
    assert result.ok
    assert calls == ["dry-run", "estimate", "install"]
    notice = [line for line in capsys.readouterr().out.splitlines() if "no CPU build" in line]
    assert len(notice) == 1
    assert "[env torch2.6]" in notice[0] and "torch 2.6.0" in notice[0] and "3.1 GB to download" in notice[0]


def test_install_prints_a_heartbeat_while_uv_is_silent(monkeypatch, tmp_path, capsys):
    import functools

    from fsdp_matrix import progress

    calls: list = []
    fake_uv(monkeypatch, " + peft==0.21.2\n", calls, delay=1.5)
    monkeypatch.setattr(installer, "Heartbeat", functools.partial(progress.Heartbeat, interval=0.3))
    assert installer.install(tmp_path / "bin" / "python", ["peft==0.21.2"], label="current").ok
    beats = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[env current] uv installing")]
    assert len(beats) >= 3, beats
    assert all(line.endswith("s)") for line in beats)
