"""S3 faults on the real parts (issue 26, items 3, 5 and 8): moto_server behind a small loopback
proxy the test can freeze (every byte held) or take down (connections refused), a real
tritonserver reading the same bucket directly, the embedded MLflow registry, ``mlreg`` run as a
separate process.

In file order: an interrupted multipart upload is aborted by the rerun (8); a promotion whose lock
lease runs out while S3 is frozen under it, and whose lock another holder then takes, stops before
any config write and leaves the other's lock alone (3); an S3 outage before any change and one
after the config write, each reported with the stage, the rollback's outcome, the store's state
and the lock left, then repaired by a rerun (5).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.devstack import local_s3
from pipelines.promote.environments import environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.storage.base import Repository, lock_key
from pipelines.storage.s3 import S3Objects
from registry.errors import StorageError
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
from tests.integration import forkcli
from tests.integration.stacks import (
    mlreg_process,
    ready_versions,
    register_scorer,
    s3_repository,
    stack_settings,
    store_objects,
    tritons,
)

pytestmark = pytest.mark.integration

DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
LEASE_S = 3  # MLREG_LOCK_LEASE of the promotion whose lease runs out: renewed every second while held
# MLREG_LOCK_LEASE of every other promotion here: a 3 s lease is lost for real on a loaded 2-core runner
# (a renewal through the proxy to moto_server slower than 2 s: 'not renewed within this process's own
# deadline'), which is the product doing its job, not the fault these tests provoke.  A holder that
# exited is still taken over at once (its pid is gone: LockInfo.holder_gone), whatever its lease.
PROMOTION_LEASE_S = 60


class Proxy:
    """A loopback TCP proxy in front of moto_server.  ``freeze_on(marker)``: from the request
    holding ``marker`` on, no byte moves either way (connections stay open) until ``thaw()``.
    ``down_on(marker)``: that request is not forwarded, and the proxy goes down -- every
    connection closed, new ones refused -- until ``up()``.  ``down_after(marker)``: that request
    is forwarded, and the proxy goes down once its response is through."""

    def __init__(self, upstream: int) -> None:
        self.upstream, self.port = upstream, 0
        self.frozen = threading.Event()
        self._cond = threading.Condition()
        self._freezing = self._down = False
        self._freeze_on: bytes | None = None
        self._down_on: bytes | None = None
        self._down_after: bytes | None = None
        self._socks: set[socket.socket] = set()
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port, self._listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                return
            with self._cond:
                if self._down:
                    client.close()
                    server.close()
                    continue
                self._socks |= {client, server}
            armed: list[Any] = [False, b""]  # [down after the response, its bytes so far]
            for src, dst, outbound in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, outbound, armed), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, outbound: bool, armed: list[Any]) -> None:
        try:
            while data := src.recv(1 << 16):
                with self._cond:
                    if outbound and self._seen(data, armed):
                        return
                    while self._freezing:
                        self._cond.wait()
                    if self._down:
                        return
                dst.sendall(data)
                if not outbound and armed[0] and _response_through(armed, data):
                    with self._cond:
                        self._go_down()
                    return
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                _close(sock)

    def _seen(self, data: bytes, armed: list[Any]) -> bool:
        """React to a marked request; True when it must not be forwarded."""
        if self._freeze_on is not None and self._freeze_on in data:
            self._freeze_on, self._freezing = None, True
            self.frozen.set()
        if self._down_after is not None and self._down_after in data:
            self._down_after, armed[0] = None, True
        if self._down_on is not None and self._down_on in data:
            self._down_on = None
            self._go_down()
            return True
        return False

    def _go_down(self) -> None:
        self._down = True
        _close(self._listener)
        for sock in self._socks:
            _close(sock)
        self._socks.clear()

    def freeze_on(self, marker: bytes) -> None:
        with self._cond:
            self._freeze_on = marker
            self.frozen.clear()

    def thaw(self) -> None:
        with self._cond:
            self._freezing = False
            self._cond.notify_all()

    def down_on(self, marker: bytes) -> None:
        with self._cond:
            self._down_on = marker

    def down_after(self, marker: bytes) -> None:
        with self._cond:
            self._down_after = marker

    def down(self) -> None:
        with self._cond:
            self._go_down()

    def up(self) -> None:
        with self._cond:
            self._down_on = self._down_after = None
            if self._down:
                self._down = False
                self._listen()

    def close(self) -> None:
        self.thaw()
        self.down()


def _response_through(armed: list[Any], data: bytes) -> bool:
    """Whether the armed request's whole response (headers; a PUT's has no body) went through,
    an interim "100 Continue" not counted."""
    armed[1] += data
    while b"\r\n\r\n" in armed[1]:
        head, _, armed[1] = armed[1].partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 100"):
            return True
    return False


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _uploads(endpoint: str, bucket: str) -> list[str]:
    client = S3Objects(bucket, "", endpoint).client
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


# -- item 8: an interrupted multipart upload is aborted --------------------------------------------


def test_an_upload_cut_by_an_outage_leaves_no_multipart_upload_after_the_rerun(
    tmp_path: Path, s3_server: Any
) -> None:
    """S3 goes down (the proxy refuses) while the parts of a 40 MB file are on their way: the
    multipart upload is left on the server (its abort cannot reach it either); the rerun aborts
    it before sending, and the version ends whole with nothing incomplete listed."""
    bucket = f"mp-{uuid.uuid4().hex[:10]}"
    local_s3.create_bucket(s3_server.endpoint, bucket)
    version = tmp_path / "big" / "1"
    version.mkdir(parents=True)
    (version / "weights.bin").write_bytes(os.urandom(40 << 20))
    proxy = Proxy(s3_server.port)
    try:
        through = f"http://127.0.0.1:{proxy.port}"

        def cut(sent: int) -> None:
            proxy.down()  # the first bytes of a part: CreateMultipartUpload went through

        with pytest.raises(StorageError, match=r"cannot upload 'big/1/weights\.bin'") as caught:
            Repository(S3Objects(bucket, "p", through, retries=1)).versions.put_version(
                "big", "1", version, progress=cut
            )
        assert "check the endpoint is reachable" in (caught.value.fix or "")
        assert _uploads(s3_server.endpoint, bucket) == ["p/big/1/weights.bin"]  # billed until aborted
        proxy.up()
        store = Repository(S3Objects(bucket, "p", through))
        assert store.versions.put_version("big", "1", version).sent == ["weights.bin"]
        assert _uploads(s3_server.endpoint, bucket) == []
        assert store.versions.verify_version("big", "1", full=True).status == "verified"
    finally:
        proxy.close()


# -- the promotion stack: Triton on the bucket, mlreg through the proxy ----------------------------


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    root: Path
    env_vars: dict[str, str]
    url: str
    proxy: Proxy
    direct: str  # the store's URI straight to moto_server (the proxy left out)
    through: str  # the environment's store URI: through the proxy

    def register(self, tag: str, weights: int = 64 << 10) -> str:
        return register_scorer(self.registry, self.root / "work", tag, weights)

    def cli(self, *args: str) -> forkcli.Process:
        return mlreg_process(self.env_vars, *args)

    def run(self, *args: str) -> tuple[int, str, str]:
        with self.cli(*args) as p:
            out, err = p.communicate(timeout=300)
        return p.returncode, out, err

    def promote(self, version: str, *extra: str) -> tuple[int, str, str]:
        return self.run("promote", "scorer", "--version", version, "--env", "s3", "--skip-quality", *extra)

    def store(self) -> Repository:
        store = open_store(self.direct)
        assert isinstance(store.objects, S3Objects)
        return store

    def desired(self) -> list[str]:
        return serving_versions(self.store().read_config("scorer"))

    def serving(self) -> list[str]:
        return ready_versions(self.url, "scorer")

    def alias(self) -> str | None:
        return self.registry.models.aliases("scorer").get("s3")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("faults")
    settings, env_vars = stack_settings(root, MLREG_LOCK_LEASE=str(PROMOTION_LEASE_S))
    direct = s3_repository(s3_server, "faults", "repo")
    proxy = Proxy(s3_server.port)
    through = f"s3://127.0.0.1:{proxy.port}/faults/repo"
    try:
        with tritons(settings, root, [direct]) as [(info, _)]:
            (root / "mlreg.toml").write_text(
                f'[environments.s3]\nstore = "{through}"\ntargets = ["{info.grpc_url}"]\n'
                'alias = "s3"\ngpu = false\n'
            )
            stack = Stack(
                settings, MlflowRegistry(settings), root, env_vars, info.grpc_url, proxy, direct, through
            )
            first = stack.register("first")
            env = environment(settings, "s3")
            Promotion(settings, env, stack.registry, Options(skip_quality=True)).run("scorer", first)
            yield stack
    finally:
        proxy.close()


def _settled(stack: Stack, version: str) -> None:
    """What serves, the store's config, its locks and the alias all say ``version``."""
    assert stack.serving() == [version]
    assert stack.desired() == [version]
    assert stack.alias() == version
    assert stack.store().session.locks() == []
    assert _uploads(stack.store().objects.endpoint_url or "", "faults") == []


# -- item 3: the lock's lease --------------------------------------------------------------------


def test_a_promotion_whose_lease_ran_out_and_whose_lock_was_taken_stops_before_any_config_write(
    stack: Stack,
) -> None:
    """S3 freezes (for mlreg only) at the new version's upload; the lease, judged by the store's
    clock, runs out; another holder takes the lock over; S3 comes back.  The promotion stops
    before the deploy writes a config, leaves the store's config, Triton and the alias as they
    were, and leaves the other holder's lock alone (its rollback changes nothing of the model
    either).  The rerun, once the other holder is done, completes."""
    before = stack.desired()
    version = stack.register("lease", weights=8 << 20)
    stack.proxy.freeze_on(f"/scorer/{version}/".encode())
    proc = mlreg_process(
        {**stack.env_vars, "MLREG_LOCK_LEASE": str(LEASE_S)},  # this promotion's lease runs out
        *("promote", "scorer", "--version", version, "--env", "s3", "--skip-quality", "--json"),
    )
    try:
        assert stack.proxy.frozen.wait(timeout=120), "the promotion never reached the upload"
        store = stack.store()
        held = store.session.read_lock("scorer")
        assert held is not None
        assert held.clock == "store"
        deadline = time.monotonic() + 10 * LEASE_S
        while not held.stale:  # nothing renews it through the frozen proxy
            assert time.monotonic() < deadline, f"the lease never ran out: {held}"
            time.sleep(0.2)
            held = store.session.read_lock("scorer")
            assert held is not None
        with store.session.lock("scorer", owner="intruder@elsewhere:1", ttl=600) as intruder:
            stack.proxy.thaw()
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 8, err
            assert re.search(
                r"the lock of model 'scorer' was lost: it is held by intruder@elsewhere:1 since "
                rf"{DATE}, lease until {DATE} \(the store's clock\); this process's lease ran until {DATE}",
                err,
            ), err
            document = json.loads(out)
            assert document["ok"] is False
            assert document["failed_stage"] in {"assemble", "deploy"}  # where it saw the loss first
            assert stack.desired() == before  # no config written
            assert stack.serving() == before
            assert stack.alias() == before[0]
            lock = json.loads(store.objects.read(lock_key("scorer")) or b"{}")
            assert (lock["owner"], lock["token"]) == ("intruder@elsewhere:1", intruder.token)
            # the lock, as users see it: refused by unlock while its lease lives, listed with dates
            code, _, err = stack.run("store", "unlock", "scorer", "--env", "s3")
            assert code == 5, err
            assert re.search(
                rf"model 'scorer' is locked by intruder@elsewhere:1 since {DATE}, lease until {DATE} "
                r"\(the store's clock\); its lease is alive",
                err,
            ), err
            code, out, err = stack.run("store", "ls", "--store", stack.through, "--json")
            assert code == 0, err
            [listed] = json.loads(out)["locks"]
            assert (listed["model"], listed["owner"], listed["stale"]) == (
                "scorer",
                "intruder@elsewhere:1",
                False,
            )
            code, out, err = stack.run("status", "--env", "s3", "--json")
            assert [lock["owner"] for lock in json.loads(out)["locks"]] == ["intruder@elsewhere:1"], err
    finally:
        stack.proxy.thaw()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert stack.run("store", "unlock", "scorer", "--env", "s3")[0] == 5  # released: nothing to unlock
    code, _, err = stack.promote(version)
    assert code == 0, err
    _settled(stack, version)


# -- item 5: what an S3 outage during a promotion left, said in the error ----------------------------


def test_an_s3_outage_says_the_stage_the_rollback_the_store_and_the_lock_and_a_rerun_repairs_it(
    stack: Stack,
) -> None:
    serving = stack.desired()
    [old] = serving
    version = stack.register("outage")
    # 1. down before anything changed (the upload's first request): no rollback runs, none fails
    stack.proxy.down_on(b"?uploads")
    code, out, err = stack.promote(version)
    stack.proxy.up()
    assert code == 8, err
    assert "✗ assemble" in err
    assert "rollback" not in err
    assert re.search(r"failed: .*cannot .*; nothing was changed; the lock of 'scorer' was left at ", err), err
    assert f"{stack.through}/.mlreg-lock.scorer.json" in err
    assert "mlreg store unlock scorer" in err
    assert version not in stack.store().list_versions("scorer")  # nothing of it was sent
    assert (stack.desired(), stack.serving(), stack.alias()) == (serving, serving, old)
    [left] = stack.store().session.locks()
    assert left.model == "scorer"
    assert left.stale  # its holder exited: a rerun takes it over
    # 2. down once the config listing both versions is written: the rollback cannot put it back
    stack.proxy.down_after(b"PUT /faults/repo/scorer/config.pbtxt")
    code, out, err = stack.promote(version, "--json")
    stack.proxy.up()
    assert code == 8, err
    document = json.loads(out)
    assert (document["ok"], document["outcome"], document["rollback"]) == (False, "rollback failed", "failed")
    assert document["failed_stage"] == "deploy"
    assert [(s["stage"], s["status"]) for s in document["stages"]][-2:] == [
        ("deploy", "failed"),
        ("rollback", "failed"),
    ]
    notes = "\n".join(document["notes"])
    assert f"the last config this promotion wrote there lists v{old},{version}" in notes
    assert f"the lock of 'scorer' was left at {stack.through}/.mlreg-lock.scorer.json" in notes
    assert f"error: promotion of scorer version {version} to 's3' failed: " in err  # not the lock's
    assert "(stage 'deploy'); the rollback failed too: " in err
    # what the outage left: the config written, the old version still serving, the lock, the alias
    assert stack.desired() == [old, version]
    assert stack.serving() == [old]
    assert stack.alias() == old
    assert [lock.model for lock in stack.store().session.locks()] == ["scorer"]
    # 3. the rerun takes the lock over and converges
    code, _, err = stack.promote(version)
    assert code == 0, err
    _settled(stack, version)


# -- issue 38, item 2: TMPDIR full, on the real parts ------------------------------------------------


def _mount_tmpfs(folder: Path, size: str) -> None:
    """A real tmpfs at ``folder`` (as root, or with passwordless sudo as on GitHub's runners)."""
    folder.mkdir(parents=True)
    for command in (["mount"], ["sudo", "-n", "mount"]):
        if shutil.which(command[0]) is None:
            continue
        options = ["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
        if subprocess.run([*command, *options], capture_output=True, check=False).returncode == 0:
            return
    pytest.fail("cannot mount a tmpfs (needs root or passwordless sudo): the full TMPDIR needs one")


def _umount(folder: Path) -> None:
    for command in (["umount", "-l"], ["sudo", "-n", "umount", "-l"]):
        if shutil.which(command[0]) is None:
            continue
        if subprocess.run([*command, str(folder)], capture_output=True, check=False).returncode == 0:
            return


def test_a_full_tmpdir_is_one_disk_full_error_and_a_rerun_promotes(stack: Stack, tmp_path: Path) -> None:
    """``mlreg promote`` with TMPDIR a real 1 MB tmpfs and a version of 2 MB: the registry's copy
    cannot be fetched into the promotion's work folder.  One "disk full at TMPDIR" error (exit 5,
    no traceback, not "internal error ... this is a bug"), nothing changed in the store, on Triton
    or in MLflow, no lock left; with TMPDIR back, the rerun promotes."""
    [old] = stack.desired()
    version = stack.register("tmpdir", weights=2 << 20)
    temp = tmp_path / "tmp"
    _mount_tmpfs(temp, "1m")
    objects = store_objects(stack.store())
    try:
        with mlreg_process(
            {**stack.env_vars, "TMPDIR": str(temp)},
            "promote",
            "scorer",
            "--version",
            version,
            "--env",
            "s3",
            "--skip-quality",
        ) as proc:
            _, err = proc.communicate(timeout=300)
    finally:
        _umount(temp)
    assert proc.returncode == StorageError.exit_code, err
    assert f"error: disk full at {temp} (TMPDIR): " in err
    assert f"fix: free space at {temp} ('df -h {temp}'), or point TMPDIR at a folder with room" in err
    assert "Traceback" not in err
    assert "internal error" not in err
    assert store_objects(stack.store()) == objects
    assert (stack.serving(), stack.alias()) == ([old], old)
    assert stack.store().session.locks() == []
    code, _, err = stack.promote(version)
    assert code == 0, err
    _settled(stack, version)
