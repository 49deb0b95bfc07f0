"""One `kdelay up` per data directory and state file; a second one fails and touches nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dev.stack.lock import StackLock, StackRunningError
from dev.stack.stack import LocalStack, StackOptions


def test_a_second_lock_on_the_same_data_dir_names_the_holder(tmp_path: Path) -> None:
    first = StackLock(tmp_path / "data", tmp_path / "a.json")
    first.acquire()
    try:
        # flock locks belong to the open file, so a second one conflicts in this process too.
        second = StackLock(tmp_path / "data", tmp_path / "b.json")
        with pytest.raises(StackRunningError) as err:
            second.acquire()
        message = str(err.value)
        assert f"pid {os.getpid()}" in message
        assert str((tmp_path / "data").resolve()) in message
        assert not second.held
        # It took neither lock: b.json's is free for a third stack.
        third = StackLock(tmp_path / "other", tmp_path / "b.json")
        third.acquire()
        third.release()
    finally:
        first.release()
    again = StackLock(tmp_path / "data", tmp_path / "b.json")
    again.acquire()
    again.release()


def test_a_shared_state_file_is_refused_too(tmp_path: Path) -> None:
    first = StackLock(tmp_path / "one", tmp_path / "up.json")
    first.acquire()
    try:
        with pytest.raises(StackRunningError, match="state file"):
            StackLock(tmp_path / "two", tmp_path / "up.json").acquire()
    finally:
        first.release()


def test_a_second_stack_fails_before_touching_the_running_ones_files(tmp_path: Path) -> None:
    data, state = tmp_path / "data", tmp_path / "up.json"
    running = StackLock(data, state)
    running.acquire()
    state.write_text(json.dumps({"proxy": "127.0.0.1:1"}))
    lines: list[str] = []
    second = LocalStack(StackOptions(data_dir=data, state_file=state), progress=lines.append)
    try:
        with pytest.raises(StackRunningError, match=f"pid {os.getpid()}"):
            second.start()
        second.stop()  # what `kdelay up` does on its way out
        assert json.loads(state.read_text()) == {"proxy": "127.0.0.1:1"}
        assert sorted(p.name for p in data.iterdir()) == ["up.lock"]
        assert lines == []  # nothing was started, nothing stopped
    finally:
        running.release()
