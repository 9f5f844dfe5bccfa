"""A source file's identity for the caches: what a replacement with the same size and times changes.

The decode cache and the dataset check's cache keep what they learnt of a file while
its identity is unchanged. Size and modification time are not enough: ``cp -p``,
``rsync -t``, an archive extracted with its stored times or ``touch -d`` give another
file of the same size the old mtime. Where the system has them (Linux, macOS, every
POSIX system) the identity adds the inode number and the inode's change time
(``st_ctime_ns``): writing to a file or setting its times changes the change time, and
no call sets it back; a file put in place by a rename (``rsync``, an atomic save) is
another inode. A ``chmod``, ``chown``, a new hard link or a rename changes it too, and
costs one more read of the file, never a wrong one. The device number is left out:
it is assigned when a file system is mounted (NFS, btrfs, overlayfs), so it changes
across remounts and differs between the nodes that share a dataset, and the path
already names the file system.

On Windows ``st_ctime`` is the creation time, which a file overwritten in place keeps,
and ``os.stat`` has no change time; there the identity adds a digest of the file's
content instead (xxHash's XXH3-128, read in chunks). That reads every file once per
run, at the disk's speed, but decodes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import xxhash

_CHUNK = 1 << 20


def source_identity(path: Path) -> list[int | str]:
    """What tells ``path``'s content apart from any other (see the module's docstring).

    Raises ``OSError`` where ``path`` cannot be read (missing, a permission).
    """
    info = path.stat()
    identity: list[int | str] = [info.st_size, info.st_mtime_ns, info.st_ino]
    if has_change_time():
        identity.append(info.st_ctime_ns)
    else:
        identity.append(content_digest(path))
    return identity


def has_change_time() -> bool:
    """Whether ``os.stat``'s ``st_ctime`` is the inode's change time (not Windows' creation)."""
    return sys.platform != "win32"


def content_digest(path: Path) -> str:
    """The XXH3-128 digest of ``path``'s bytes, in hex, read a chunk at a time."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
