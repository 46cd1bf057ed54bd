"""Pack a render's installed files (its etc/ and usr/ trees) into one tar, on the controller.

One archive is one transfer to the machine, where a copy task a file took a round trip each (about
60 s for the cpu tier over podman, in converge and again in the idempotence run). The archive is
byte-for-byte the same for the same files: names sorted, owner root, mtime 0, the modes render
wrote (programs 0755, configuration 0644), so its checksum says whether anything changed.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

TREES = ("etc", "usr")


def files(render_dir: Path) -> list[Path]:
    """The regular files under the render's trees (what the role's find lists: no links)."""
    return sorted(p for tree in TREES if (render_dir / tree).is_dir()
                  for p in (render_dir / tree).rglob("*") if p.is_file() and not p.is_symlink())


def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def pack(render_dir: Path, out: Path) -> int:
    found = files(render_dir)
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for f in found:
            tar.add(f, arcname=f.relative_to(render_dir).as_posix(), recursive=False, filter=as_root)
    return len(found)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: pack_render.py RENDER_DIR OUT.tar")
    print(pack(Path(sys.argv[1]), Path(sys.argv[2])))
