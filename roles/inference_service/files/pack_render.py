"""Pack a render's installed files (those the role's find listed) into one tar, on the controller.

One archive is one transfer to the machine, where a copy task a file took a round trip each (about
60 s for the cpu tier over podman, in converge and again in the idempotence run). The archive is
byte-for-byte the same for the same files: names sorted, owner root, mtime 0, the modes render
wrote (programs 0755, configuration 0644), so its checksum says whether anything changed.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path


def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def pack(render_dir: Path, out: Path, files: list[Path]) -> None:
    """`files` (the role's list of the render's installed files), by name, under render_dir."""
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for f in sorted(files):
            tar.add(f, arcname=f.relative_to(render_dir).as_posix(), recursive=False, filter=as_root)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: pack_render.py RENDER_DIR OUT.tar FILE...")
    pack(Path(sys.argv[1]), Path(sys.argv[2]), [Path(f) for f in sys.argv[3:]])
