"""The publishers' record on the node is written like every other state file: through a fresh
temp file (nothing planted at a guessable name is followed), and under the one file lock."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from dra_driver.cdi.writer import hold_file_lock
from dra_driver.resourceslice.publisher import PUBLISHERS_FILE, register_publisher


def test_a_symlink_at_the_old_temp_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    # The name the old writer used: guessable from the agent's pid.
    (tmp_path / f".{PUBLISHERS_FILE}.{os.getpid()}.tmp").symlink_to(victim)
    publisher = register_publisher(tmp_path, "pod-a")
    assert publisher is not None
    assert victim.read_text() == "precious"
    assert json.loads((tmp_path / PUBLISHERS_FILE).read_text()) == {"pod-a": publisher.rank}
    assert not (tmp_path / PUBLISHERS_FILE).is_symlink()


def test_a_symlink_at_the_record_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / PUBLISHERS_FILE).symlink_to(victim)
    assert register_publisher(tmp_path, "pod-a") is not None
    assert victim.read_text() == "precious"
    assert not (tmp_path / PUBLISHERS_FILE).is_symlink()


def test_a_symlink_at_the_lock_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "publishers.lock").symlink_to(target)
    with pytest.raises(OSError) as info:
        register_publisher(tmp_path, "pod-a")
    assert info.value.errno == errno.ELOOP
    assert not target.exists()


def test_no_temp_file_is_left_behind(tmp_path: Path) -> None:
    register_publisher(tmp_path, "pod-a")
    register_publisher(tmp_path, "pod-b")
    assert sorted(p.name for p in tmp_path.iterdir()) == [PUBLISHERS_FILE, "publishers.lock"]


def test_a_missing_state_directory_is_created(tmp_path: Path) -> None:
    state = tmp_path / "a" / "b"
    assert register_publisher(state, "pod-a") is not None
    assert (state / PUBLISHERS_FILE).exists()


def test_registration_waits_for_the_lock_holder(tmp_path: Path) -> None:
    done = threading.Event()

    def register() -> None:
        register_publisher(tmp_path, "pod-b")
        done.set()

    with hold_file_lock(tmp_path / "publishers.lock"):
        thread = threading.Thread(target=register)
        thread.start()
        time.sleep(0.2)
        assert not done.is_set()
    thread.join(timeout=10)
    assert done.is_set()
