"""Lightning checkpoints: written atomically, read with weights_only=True, bad ones are one-line errors."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from helpers import compose_train, run_record, train_run

from numdev.cli.errors import user_facing
from numdev.train.checkpoint_io import CheckpointError, SafeCheckpointIO, load_checkpoint
from numdev.train.run import train


class Payload:
    """Unpickling this would create a directory: the proof that pickled code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture(scope="module")
def _run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    train(compose_train("trainer.max_steps=2", run_dir=run_dir))
    return run_dir


@pytest.fixture
def short_run(_run):
    """A 2-step smoke run, its checkpoint restored after each test."""
    path = _run / "checkpoints" / "last.ckpt"
    digest = _run / "checkpoints" / "last.ckpt.sha256"
    saved, saved_digest = path.read_bytes(), digest.read_bytes()
    yield _run
    path.write_bytes(saved)
    digest.write_bytes(saved_digest)


def _resume_error(capsys, run_dir) -> str:
    with pytest.raises(SystemExit) as exit_:
        user_facing("numdev-train")(train)(compose_train("trainer.max_steps=4", "resume=true", run_dir=run_dir))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("numdev-train: error:")]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_a_copied_run_directory_resumes_and_compares(_run, tmp_path):
    """A run directory copied elsewhere still resumes (the saved config's paths into the old directory
    are read as the new one) and compares (numdev-compare takes directories); the original is untouched."""
    from numdev.analysis.compare import main as compare

    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(_run, copy)
    train_run("trainer.max_steps=4", "resume=true", run_dir=copy)
    assert run_record(copy)["final_step"] == 4 and run_record(copy)["resumes"][0]["from_step"] == 2
    assert run_record(_run)["final_step"] == 2
    compare([str(_run), str(copy), "-o", str(tmp_path / "cmp")])
    assert len((tmp_path / "cmp" / "distances.csv").read_text().splitlines()) > 1


def test_checkpoints_load_with_weights_only(short_run):
    checkpoint = load_checkpoint(short_run / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 2 and "numdev" in checkpoint
    assert isinstance(checkpoint["numdev"]["noise_generator"], torch.Tensor)


def test_a_checkpoint_with_pickled_code_is_refused_and_the_code_never_runs(short_run, tmp_path, capsys):
    run_dir = short_run
    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    marker = tmp_path / "pwned"
    checkpoint["numdev"]["extra"] = Payload(str(marker))
    torch.save(checkpoint, path)
    line = _resume_error(capsys, run_dir)
    assert str(path) in line and "refused to load" in line and "weights_only=True" in line
    assert "mkdir" in line  # names what it refused
    assert not marker.exists()
    with pytest.raises(CheckpointError):  # Lightning's own loading path goes through the same reader
        SafeCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not_lightning"])
def test_a_damaged_checkpoint_is_a_one_line_error_naming_the_file(short_run, tmp_path, capsys, damage):
    run_dir = short_run
    path = run_dir / "checkpoints" / "last.ckpt"
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00garbage" * 100)
    else:
        torch.save({"weights": torch.zeros(2)}, path)
    line = _resume_error(capsys, run_dir)
    assert str(path) in line
    expected = "is not a Lightning checkpoint" if damage == "not_lightning" else "truncated or corrupt"
    assert expected in line


def test_a_failing_checkpoint_write_leaves_the_previous_one_intact(short_run, tmp_path, monkeypatch):
    import errno

    import numdev.runs.atomic

    run_dir = short_run
    path = run_dir / "checkpoints" / "last.ckpt"
    before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(numdev.runs.atomic.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        SafeCheckpointIO().save_checkpoint({"global_step": 3, "state_dict": {}}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]  # no temporary file left


def test_a_run_made_before_the_new_config_keys_still_resumes(short_run):
    """config.yaml of a run from before trainer.strategy/num_nodes and callbacks.instability existed."""
    import yaml

    path = short_run / "config.yaml"
    saved = path.read_text()
    config = yaml.safe_load(saved)
    del config["trainer"]["strategy"], config["trainer"]["num_nodes"], config["callbacks"]["instability"]
    path.write_text(yaml.safe_dump(config))
    try:
        from numdev.runs.record import check_resumable

        check_resumable(short_run, compose_train("trainer.max_steps=4", "resume=true", run_dir=short_run))
        with pytest.raises(ValueError, match="trainer.strategy"):  # but not another strategy
            check_resumable(short_run, compose_train("trainer.strategy=ddp", "resume=true", run_dir=short_run))
    finally:
        path.write_text(saved)


# -- integrity (issue 23, class 2): a checkpoint changed after it was written is never resumed from ----


def _tensor_data_offsets(path) -> list[tuple[int, int]]:
    """(start, size) of every tensor's bytes inside a torch zip checkpoint, largest first."""
    import struct
    import zipfile

    spans = []
    with zipfile.ZipFile(path) as archive:
        raw = path.read_bytes()
        for info in archive.infolist():
            if "/data/" in info.filename and info.file_size >= 8:
                name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
                spans.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    return sorted(spans, key=lambda s: -s[1])


def flip(path, where: str, bit: int = 0) -> None:
    """Flip one bit of a checkpoint: in a tensor's data (start, middle, last byte, an fp32 exponent
    bit) so that the file still loads and only a checksum can tell."""
    data = bytearray(path.read_bytes())
    start, size = _tensor_data_offsets(path)[0 if where != "small" else -1]
    offset = {"first": start, "middle": start + size // 2, "last": start + size - 1, "small": start,
              "exponent": start + 4 * (size // 8) + 3}[where]
    data[offset] ^= 1 << (6 if where == "exponent" else bit)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("where", "bit"), [("first", 0), ("middle", 3), ("last", 7), ("exponent", 6), ("small", 1), ("middle", 0)])
@pytest.mark.parametrize("resume", ["true", "auto"])
def test_a_bit_flip_in_the_checkpoint_is_refused_at_resume(short_run, capsys, where, bit, resume):
    path = short_run / "checkpoints" / "last.ckpt"
    flip(path, where, bit)
    torch.load(path, weights_only=True)  # the file still loads: only the checksum tells
    with pytest.raises(SystemExit) as exit_:
        user_facing("numdev-train")(train)(compose_train("trainer.max_steps=4", f"resume={resume}", run_dir=short_run))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("numdev-train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{path}: its sha256 does not match last.ckpt.sha256" in lines[0] and "resume=auto" in lines[0]
    assert "nonfinite" not in err


@pytest.mark.parametrize(
    "sidecar",
    [b"garbage\xff", b"[1, 2]", b'{"previous": null}', b'{"sha256": 5}', b'{"sha256": "abc"}', b"", b'{"sha256": ["x"]}'],
)
def test_a_damaged_checksum_file_is_one_error_naming_it(short_run, sidecar):
    digest = short_run / "checkpoints" / "last.ckpt.sha256"
    digest.write_bytes(sidecar)
    with pytest.raises(CheckpointError, match=rf"{digest}: not a checksum record"):
        load_checkpoint(short_run / "checkpoints" / "last.ckpt")


def test_a_kill_between_the_checksum_and_the_checkpoint_write_still_resumes(short_run, monkeypatch):
    """The checksum file is written first and lists the checkpoint it replaces: a kill before the
    checkpoint's own write leaves the previous checkpoint, which still verifies."""
    import numdev.train.checkpoint_io as checkpoint_io

    path = short_run / "checkpoints" / "last.ckpt"
    before = path.read_bytes()

    def killed(target, data):
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(checkpoint_io, "write_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_io.save_checkpoint({"global_step": 3, "state_dict": {"w": torch.ones(2)}}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(path)["global_step"] == 2  # verified against "previous"
    checkpoint_io.save_checkpoint({"global_step": 3, "state_dict": {"w": torch.ones(2)}}, path)
    assert load_checkpoint(path)["global_step"] == 3


def test_a_checkpoint_without_its_checksum_file_is_refused_naming_both(short_run):
    digest = short_run / "checkpoints" / "last.ckpt.sha256"
    digest.unlink()
    with pytest.raises(CheckpointError, match=r"last\.ckpt: its checksum file last\.ckpt\.sha256 is missing.*resume=auto"):
        load_checkpoint(short_run / "checkpoints" / "last.ckpt")


def test_removing_a_checkpoint_removes_its_checksum(tmp_path):
    path = tmp_path / "other.ckpt"
    SafeCheckpointIO().save_checkpoint({"global_step": 1, "state_dict": {}}, path)
    assert (tmp_path / "other.ckpt.sha256").is_file()
    SafeCheckpointIO().remove_checkpoint(path)
    assert list(tmp_path.iterdir()) == []


def test_a_run_keeps_only_numdevs_checkpoint_and_none_without_it(_run, tmp_path):
    """Lightning adds its own ModelCheckpoint when none is given: a study's short runs
    (callbacks.checkpoint=null) would each write a 20+ MB checkpoints/epoch=...ckpt nobody reads."""
    assert sorted(p.name for p in (_run / "checkpoints").iterdir()) == ["last.ckpt", "last.ckpt.sha256"]
    run_dir = tmp_path / "no_checkpoint"
    train(compose_train("trainer.max_steps=2", "callbacks.checkpoint=null", run_dir=run_dir))
    assert not (run_dir / "checkpoints").exists()
