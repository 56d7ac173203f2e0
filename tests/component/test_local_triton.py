"""The local tritonserver launcher: checks that run before any server starts."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from pipelines.devstack import local_triton
from registry.errors import StackError
from registry.settings import Settings


def test_the_wheel_ships_a_server_and_a_stub_for_this_python() -> None:
    install = local_triton.locate_triton()
    assert install.server.is_file()
    assert install.stub.parent.name == local_triton.python_version_tag()
    assert local_triton.missing_libraries(install.stub, local_triton.server_env(install)) == []


@pytest.fixture
def broken_stub(tmp_path: Path) -> Path:
    """A real ELF binary whose shared library was removed after linking."""
    assert shutil.which("gcc"), "gcc is missing: 'make test' installs it (.ci/system-deps.sh)"
    (tmp_path / "gone.c").write_text("int gone(void) { return 1; }\n")
    (tmp_path / "stub.c").write_text("int gone(void);\nint main(void) { return gone(); }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", tmp_path / "libmlreggone.so", tmp_path / "gone.c"], check=True
    )
    subprocess.run(
        [
            "gcc",
            "-o",
            tmp_path / "triton_python_backend_stub",
            tmp_path / "stub.c",
            f"-L{tmp_path}",
            "-lmlreggone",
        ],
        check=True,
    )
    (tmp_path / "libmlreggone.so").unlink()
    return tmp_path / "triton_python_backend_stub"


def test_a_stub_with_a_missing_library_is_reported_before_the_server_starts(
    broken_stub: Path,
    tmp_path: Path,
) -> None:
    install = dataclasses.replace(local_triton.locate_triton(), stub=broken_stub)
    with pytest.raises(
        StackError,
        match=r"cannot start: shared libraries not found: "
        r"libmlreggone\.so",
    ):
        local_triton.start_server(
            tmp_path, tmp_path / "state", Settings.from_env().backends_source, install=install
        )
    assert not (tmp_path / "state" / "triton.log").exists()


def test_busy_ports_are_refused_with_the_port_named(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = (port, local_triton.free_port(), local_triton.free_port())
        with pytest.raises(StackError, match=rf"port\(s\) {port} on 127.0.0.1 already in use"):
            local_triton.start_server(
                tmp_path, tmp_path / "state", Settings.from_env().backends_source, ports=ports
            )


def test_backend_dir_holds_the_python_backend_and_the_standins(tmp_path: Path) -> None:
    install = local_triton.locate_triton()
    dest = local_triton.build_backend_dir(install, Settings.from_env().backends_source, tmp_path)
    assert sorted(p.name for p in (dest / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    for backend in ("onnxruntime", "tensorflow"):
        assert (dest / backend / "model.py").is_file()
        assert (dest / backend / "standin_base.py").is_file()


def test_pid_alive_is_false_for_processes_that_are_not_tritonserver() -> None:
    import os

    assert not local_triton.pid_alive(os.getpid())
    assert not local_triton.pid_alive(2**22 + 1)


def test_server_info_round_trips(tmp_path: Path) -> None:
    info = local_triton.ServerInfo(
        pid=1,
        grpc_port=2,
        http_port=3,
        metrics_port=4,
        repository="/r",
        log_path="/l",
        shm_prefix="p",
        started_at=5.0,
    )
    local_triton.save_info(info, tmp_path / "s.json")
    loaded = local_triton.load_info(tmp_path / "s.json")
    assert loaded == info
    assert loaded.to_dict()["grpc_url"] == "127.0.0.1:2"
    (tmp_path / "bad.json").write_text("{not json")
    assert local_triton.load_info(tmp_path / "bad.json") is None


def test_a_server_s_three_ports_are_distinct_and_free() -> None:
    """500 triples from ``three_free_ports``, each of three different ports (three ``free_port``
    calls could repeat one: a tritonserver once got one port for HTTP and metrics and exited at
    start), each port bindable again at once; 40 from ``free_ports``, all different.  That they are
    held together is the next test's."""
    for _ in range(500):
        ports = local_triton.three_free_ports()
        assert len(set(ports)) == 3, ports
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", port))
    held = local_triton.free_ports(40)
    assert len(set(held)) == 40, held


def test_no_port_of_a_triple_is_let_go_before_the_last_is_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes the three ports distinct, seen directly: every socket is bound before any is
    closed.  (That the kernel would hand a released port out again cannot be provoked at will: its
    pick is random, so the test above alone would not fail reliably if the ports were let go one by
    one.  The real sockets are used; the subclass only records the order of the calls.)"""
    calls: list[str] = []

    class Recorded(socket.socket):
        def bind(self, address: object) -> None:
            super().bind(address)
            calls.append("bind")

        def close(self) -> None:
            if self.fileno() != -1:
                calls.append("close")
            super().close()

    monkeypatch.setattr(socket, "socket", Recorded)
    ports = local_triton.three_free_ports()
    assert len(set(ports)) == 3, ports
    assert calls == ["bind"] * 3 + ["close"] * 3, calls
