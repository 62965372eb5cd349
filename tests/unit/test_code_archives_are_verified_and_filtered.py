"""The spec's `code:` archive: unpacked only when its digest is named, and through tarfile's data filter.

Two gaps of issue 18: an archive without `code_sha256` was unpacked unverified, so whoever could
write its S3 key between submit and an attempt chose the code the job ran; and a member whose path
ran through a link already in the working directory (the image's own) was written wherever that
link pointed, since the project's checks look at the archive, not at the folder it lands in.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from gpujobs_trainer.code_archive import CodeArchiveError, fetch, unpack


def an_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


class FakeS3:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.downloads = 0

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        self.downloads += 1
        Path(filename).write_bytes(self.body)


def test_an_archive_without_its_digest_is_refused_before_it_is_fetched(tmp_path: Path) -> None:
    s3 = FakeS3(b"whatever is in the bucket now")

    with pytest.raises(CodeArchiveError, match="without code_sha256: refused"):
        fetch("s3://shared-data/code.tar.gz", "", tmp_path, s3=s3)
    assert s3.downloads == 0


def test_an_archive_with_its_digest_is_fetched(tmp_path: Path) -> None:
    body = an_archive(tmp_path / "made.tar.gz", {"train.py": b"print(1)"}).read_bytes()

    fetched = fetch("s3://shared-data/code.tar.gz", hashlib.sha256(body).hexdigest(), tmp_path, s3=FakeS3(body))

    assert fetched.read_bytes() == body


@pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="this Python has no tarfile.data_filter (PEP 706)")
def test_a_member_through_a_link_already_in_the_working_dir_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    # Given a working directory whose image put a link to a folder outside it
    outside, workdir = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    workdir.mkdir()
    (workdir / "lib").symlink_to(outside)
    archive = an_archive(tmp_path / "code.tar.gz", {"train.py": b"ok", "lib/evil.py": b"planted"})

    with pytest.raises(CodeArchiveError, match="outside the destination"):
        unpack(archive, workdir)

    assert list(outside.iterdir()) == []
    assert not (workdir / "train.py").exists()


def test_where_python_has_no_data_filter_the_projects_own_checks_still_unpack_and_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpujobs_trainer.code_archive._DATA_FILTER", None)  # a base image's Python < 3.11.4
    workdir = tmp_path / "work"
    workdir.mkdir()

    assert unpack(an_archive(tmp_path / "ok.tar.gz", {"pkg/train.py": b"ok"}), workdir) == 1
    with pytest.raises(CodeArchiveError, match="not a path inside"):
        unpack(an_archive(tmp_path / "bad.tar.gz", {"../escape.py": b"x"}), workdir)
    assert (workdir / "pkg" / "train.py").read_bytes() == b"ok"
    assert not (tmp_path / "escape.py").exists()
